"""``ddplab_node``: run one command on the node over the task's connection, without a module wrapper; and
the one way node code (``nodeprobe``) runs.

Why not ``ansible.builtin.command``: the command module is a Python program that Ansible packs, sends and
starts on the node for every call (AnsiballZ), and that program then starts the command. Its own start
costs the node about 0.4 CPU-seconds a call (measured: 20 calls of ``/bin/true`` took 9.2-13.4 CPU-s through
the command module, 1.1-1.2 through ``raw``), and a launch makes dozens of such calls per node. Here the
command goes through the same path a pipelined module does (the connection, ``become``, the task's
``environment``), minus the module: ``/bin/sh -c 'cd CHDIR && ENV=.. ARGV'`` with stdin sent along.

Arguments (a subset of the command module's, same meaning): ``argv`` (list) or ``cmd`` (a string split
like the command module splits it: no shell features; unlike it, $VARS in arguments are not expanded),
``chdir``, ``stdin`` (a newline is added, as the command module does). Returns ``rc``, ``stdout``,
``stderr`` (trailing newlines stripped), ``stdout_lines``, ``stderr_lines``, ``cmd``, ``delta``; fails
when rc is not 0 unless the task's ``failed_when`` says otherwise. In check mode it is skipped unless the
task sets ``check_mode: false`` (as the command module). The command always gets stdin (at least the
newline): without it the ssh connection would ask for a terminal, which merges stderr into stdout.

Node code: ``nodeprobe: VERB`` runs a verb of nodeprobe/, the one way roles run node code: ``argv`` are
then the verb's arguments, ``stdin`` its input (text, or data sent as JSON); ``python`` is the interpreter
a probe shipped alone examines, ``lab`` another lab folder (a node left out by --limit, delegated to).
ddplab/node_command.py chooses the interpreter and the code folder.
"""

from __future__ import annotations

import json
import shlex
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.action import ActionBase

from ddplab.node_command import NodeCommandError, host_command

DOCUMENTATION = """
name: ddplab_node
short_description: Run a command, or a nodeprobe verb, on the node without a module wrapper
options:
  argv: {type: list, elements: str, description: "The command and its arguments; with nodeprobe, the verb's."}
  cmd: {type: str, description: The command line, split without a shell or $VARS expansion (or argv).}
  chdir: {type: str, description: Folder on the node to run in.}
  stdin: {type: raw, description: Text on the command's stdin (a newline added); nodeprobe's data as JSON.}
  nodeprobe: {type: str, description: A nodeprobe verb (ddplab/node_command.py runs it).}
  python: {type: str, description: For a verb shipped alone, the interpreter it examines.}
  lab: {type: str, description: With a nodeprobe verb, the lab folder whose code and Python record to use.}
"""

class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("argv", "cmd", "chdir", "stdin", "nodeprobe", "python", "lab"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "argv": {"type": "list", "elements": "str"},
            "cmd": {"type": "str"},
            "chdir": {"type": "str"},
            "stdin": {"type": "raw"},
            "nodeprobe": {"type": "str"},
            "python": {"type": "str"},
            "lab": {"type": "str"},
        }, mutually_exclusive=[("argv", "cmd"), ("nodeprobe", "cmd")],
            required_one_of=[("argv", "cmd", "nodeprobe")],
            required_by={"python": "nodeprobe", "lab": "nodeprobe"})
        if self._play_context.check_mode:
            result.update(skipped=True, msg="skipped in check mode (set check_mode: false to run it)")
            return result
        given = args.get("argv")
        argv = [to_text(a) for a in given] if given is not None else shlex.split(args.get("cmd") or "")
        stdin = args.get("stdin")
        if args.get("nodeprobe"):
            argv, stdin = self._nodeprobe(args, argv, stdin, task_vars or {})
        elif stdin is not None and not isinstance(stdin, str):
            raise AnsibleActionFail("ddplab_node: stdin is text (data goes as JSON only to a nodeprobe verb)")
        if not argv:
            raise AnsibleActionFail("ddplab_node: the command is empty")
        line = shlex.join(argv)
        environment = self._compute_environment_string()
        if environment:
            line = f"{environment} {line}"
        chdir = args.get("chdir")
        start = time.monotonic()
        res = self._low_level_execute_command(
            line, in_data=to_bytes((stdin or "") + "\n"),
            chdir=shlex.quote(chdir) if chdir else None)
        out, err = res["stdout"].rstrip("\r\n"), res["stderr"].rstrip("\r\n")
        rc = res["rc"]
        result.update(
            cmd=argv, rc=rc, stdout=out, stderr=err, stdout_lines=out.splitlines(),
            stderr_lines=err.splitlines(), delta=f"{time.monotonic() - start:.3f}", changed=True,
            failed=rc != 0)
        if rc != 0:
            result["msg"] = "non-zero return code"
        return result

    def _nodeprobe(self, args, verb_args, stdin, task_vars):
        """The command and stdin of a nodeprobe verb (see the module docstring)."""
        try:
            argv, program = host_command(args["nodeprobe"], verb_args,
                                         lambda name: self._templar.template(task_vars.get(name)),
                                         args.get("python"), args.get("lab"))
        except NodeCommandError as e:
            raise AnsibleActionFail(f"ddplab_node: {e}") from None
        if stdin is not None and not isinstance(stdin, str):
            stdin = json.dumps(stdin)
        return argv, (program or "") + (stdin or "")  # a shipped verb's input follows its program
