"""``ddplab_wait``: follow the node's rank of a run until it ends, in one task, a progress line per poll.

Each poll runs ``ARGV --wait POLL`` on the node (``nodeprobe run-status``: it answers as soon as the rank's
exit code is written, else after POLL seconds) and prints ``HOST: <state> <progress> | <last line>`` through
Ansible's display. It stops when the state is no longer ``running`` or ``queued``, or after ``max_polls``
polls (``timed_out``).

Why one task: a poll written as tasks (run the probe, set the state, print it, decide, include the file
again) made 8 task results per node and poll, each a worker process forked on the control host. Measured on
2 simulated hosts, 15 more polls cost the control host 13.6 CPU-s more (0.45 CPU-s per node and poll): a
wait of minutes on 16 nodes kept most of a core busy. Here a poll is one command over the connection.

Arguments: ``argv`` (the command, without ``--wait``; with ``nodeprobe: run-status``, the verb's arguments,
run as ddplab_node runs node code: ddplab/node_command.py), ``chdir``, ``poll`` (seconds), ``max_polls``,
``gone_ok`` (an elastic run: a node that no longer answers over SSH is ``gone``, not unreachable). Returns
``state`` (the last answer, a dict as ``run-status`` prints it), ``polls`` and ``timed_out``. Fails when the
command exits non-zero or prints no JSON. Runs in check mode too (it only reads).
"""

from __future__ import annotations

import json
import shlex

from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ddplab.node_command import NodeCommandError, host_command

DOCUMENTATION = """
name: ddplab_wait
short_description: Follow the node's rank until it ends, printing a progress line per poll
options:
  argv: {type: list, elements: str, required: true, description: "The command (or the verb's), no --wait."}
  nodeprobe: {type: str, description: The nodeprobe verb that answers (run-status).}
  chdir: {type: str, description: Folder on the node to run in.}
  poll: {type: int, default: 10, description: Seconds the node waits for the exit code per poll.}
  max_polls: {type: int, required: true, description: Polls before giving up (timed_out).}
  gone_ok: {type: bool, default: false, description: An unreachable node is state gone (elastic runs).}
"""

display = Display()

LIVE = ("running", "queued")
GONE = {"state": "gone", "code": None, "step": None, "loss": None, "tokens_per_sec": None,
        "last_line": "went away (no answer over SSH); the group went on without it"}


def progress_line(state: dict) -> str:
    """A node's line each poll: the state, the exit code, the progress, the last line of the log."""
    code = f" code {state['code']}" if state.get("code") is not None else ""
    last = str(state.get("last_line") or "")
    last = last if len(last) <= 100 else last[:97] + "..."
    return f"{state.get('state')}{code} {state.get('progress') or ''} | {last}"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("argv", "nodeprobe", "chdir", "poll", "max_polls", "gone_ok"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "nodeprobe": {"type": "str"},
            "chdir": {"type": "str"},
            "poll": {"type": "int", "default": 10},
            "max_polls": {"type": "int", "required": True},
            "gone_ok": {"type": "bool", "default": False},
        })
        host = (task_vars or {}).get("inventory_hostname", "")
        argv = [*map(to_text, args["argv"]), "--wait", str(args["poll"])]
        if args.get("nodeprobe"):
            argv = self._nodeprobe(args["nodeprobe"], argv, task_vars or {})
        line = shlex.join(argv)
        environment = self._compute_environment_string()
        if environment:
            line = f"{environment} {line}"
        chdir = shlex.quote(args["chdir"]) if args.get("chdir") else None
        state, polls = {"state": "running"}, 0
        while state.get("state") in LIVE and polls < args["max_polls"]:
            polls += 1
            try:
                res = self._low_level_execute_command(line, in_data=b"\n", chdir=chdir)
            except AnsibleConnectionFailure:
                if not args["gone_ok"]:
                    raise
                state = dict(GONE)
                break
            state, problem = self._answer(res)
            if problem:
                result.update(failed=True, msg=problem, polls=polls, changed=False)
                return result
            display.display(f"{host}: {progress_line(state)}")
        # the fact launch_state too: no set_fact task after each wait
        result.update(state=state, polls=polls, timed_out=state.get("state") in LIVE, changed=False,
                      ansible_facts={"launch_state": state})
        return result

    def _nodeprobe(self, verb: str, verb_args: list[str], task_vars: dict) -> list[str]:
        """The command that runs `verb` of the synced code (as ddplab_node's nodeprobe)."""
        try:
            argv, _ = host_command(verb, verb_args, lambda name: self._templar.template(task_vars.get(name)))
        except NodeCommandError as e:
            raise AnsibleActionFail(f"ddplab_wait: {e}") from None
        return argv

    @staticmethod
    def _answer(res: dict) -> tuple[dict, str | None]:
        """The node's answer as a dict, or what is wrong with it."""
        out, err = to_text(res.get("stdout", "")), to_text(res.get("stderr", "")).strip()
        lines = [ln for ln in out.splitlines() if ln.startswith("{")]
        if res.get("rc") != 0 or not lines:
            return {}, f"run-status exited with code {res.get('rc')}: {(err or out.strip())[-2000:]}"
        try:
            return json.loads(lines[-1]), None
        except ValueError as e:
            return {}, f"run-status printed no JSON ({e}): {lines[-1][:200]}"
