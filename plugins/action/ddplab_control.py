"""``ddplab_control``: run one control-side step (``python -m ddplab VERB ...``) in Ansible's own worker.

Why not ``ansible.builtin.command`` with ``delegate_to: localhost``: that packs, copies and starts a
module wrapper for every call, about 0.25 s each on the control host, and a launch runs seven such
steps; a subprocess started from the worker costs the program's own time only (measured: 10 calls of
``python -c pass`` took 3.0 s as delegated commands, 0.76 s here). The task runs on the control host
whatever host it is attached to, so it needs no ``delegate_to``.

Arguments (a subset of the command module's, same meaning): ``argv`` (list, required), ``chdir``,
``stdin``. Returns ``rc``, ``stdout``, ``stderr``, ``stdout_lines``, ``stderr_lines``, ``cmd``,
``delta``; fails when rc is not 0 unless the task's ``failed_when`` says otherwise. In check mode it
is skipped unless the task sets ``check_mode: false`` (as the command module).
"""

from __future__ import annotations

import os
import subprocess
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase

DOCUMENTATION = """
name: ddplab_control
short_description: Run a ddplab control-side step on the control host, without a module wrapper
options:
  argv: {type: list, elements: str, required: true, description: The command and its arguments.}
  chdir: {type: path, description: Folder to run in.}
  stdin: {type: str, description: Text written to the command's standard input.}
"""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("argv", "chdir", "stdin"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "chdir": {"type": "path"},
            "stdin": {"type": "str"},
        })
        if self._play_context.check_mode:
            result.update(skipped=True, msg="skipped in check mode (set check_mode: false to run it)")
            return result
        argv = [to_text(a) for a in args["argv"]]
        if not argv:
            raise AnsibleActionFail("ddplab_control: argv is empty")
        chdir = args.get("chdir")
        if chdir and not os.path.isdir(chdir):
            raise AnsibleActionFail(f"ddplab_control: chdir {chdir} is not a folder")
        stdin = args.get("stdin")
        start = time.monotonic()
        try:
            proc = subprocess.run(argv, cwd=chdir, input=stdin if stdin is not None else "",
                                  capture_output=True, text=True, check=False)
        except OSError as e:
            raise AnsibleActionFail(f"ddplab_control: cannot run {argv[0]}: {e}") from None
        out, err = proc.stdout.rstrip("\n"), proc.stderr.rstrip("\n")
        result.update(
            cmd=argv, rc=proc.returncode, stdout=out, stderr=err, stdout_lines=out.splitlines(),
            stderr_lines=err.splitlines(), delta=f"{time.monotonic() - start:.3f}", changed=True,
            failed=proc.returncode != 0)
        if proc.returncode != 0:
            result["msg"] = "non-zero return code"
        return result
