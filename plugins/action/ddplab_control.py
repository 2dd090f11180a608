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

Long steps (the transfers: ``ddplab sync-push``, ``ddplab relay``) show their progress while they run:
with ``progress: true`` the command gets ``--progress FILE`` (a file in a private temporary folder; FILE
and the folder are removed afterwards, anything else put there is left) and rewrites FILE as JSON with a
``line`` (or ``lines``); every ``progress_every`` seconds the line is printed as ``progress_label: line``,
and the last one (what was sent, how fast) when it ends; the result's ``progress_lines`` holds that last
one. Ansible's default output shows a task only when it ends, which is why the transfers used to run as
async jobs polled by three tasks a round (a module run each on the control host); here one task does it.
``timeout`` (s) stops the command (SIGTERM, then SIGKILL) and fails the task.

``show: true`` prints what the command printed once it ends (stdout, or stderr when it exited non-zero), as a
debug task after it would, without that task.

``fact: NAME``: when the command exits 0, its stdout (JSON) becomes the fact NAME, on every host of the play
when the task is ``run_once`` (how ``python -m ddplab plan`` hands its plan to the plays: one task, no
``set_fact`` after it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_text
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

DOCUMENTATION = """
name: ddplab_control
short_description: Run a ddplab control-side step on the control host, without a module wrapper
options:
  argv: {type: list, elements: str, required: true, description: The command and its arguments.}
  chdir: {type: path, description: Folder to run in.}
  stdin: {type: str, description: Text written to the command's standard input.}
  progress: {type: bool, default: false, description: Add --progress FILE and print FILE's line as it runs.}
  progress_label: {type: str, default: "", description: What the progress lines start with.}
  progress_every: {type: float, default: 3, description: Seconds between progress lines.}
  timeout: {type: int, default: 0, description: Stop the command after this many seconds (0 = never).}
  fact: {type: str, default: "", description: The fact that receives stdout (JSON) when the command exits 0.}
  show: {type: bool, default: false, description: Print stdout (stderr when it failed) once the command ends.}
"""

display = Display()

STOP_GRACE_S = 5


def progress_lines(path: str) -> list[str]:
    """The line(s) the command last wrote to its progress file; [] before it wrote any."""
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return []
    lines = state.get("lines") or ([state["line"]] if state.get("line") else [])
    return [str(line) for line in lines]


def follow(proc: subprocess.Popen, stdin: str, progress: str | None, label: str, every: float,
           timeout: int) -> tuple[str, str, bool]:
    """Feed stdin and wait for the end, printing the progress file's lines every `every` s.
    Returns (stdout, stderr, whether the timeout stopped it)."""
    deadline = time.monotonic() + timeout if timeout > 0 else None
    feed: str | None = stdin
    while True:
        wait = every if progress else None
        if deadline is not None:
            left = max(deadline - time.monotonic(), 0.0)
            wait = left if wait is None else min(wait, left)
        try:
            out, err = proc.communicate(feed, timeout=wait)
            return out, err, False
        except subprocess.TimeoutExpired:
            feed = None  # communicate() sent it already; a later call must not send it again
        if deadline is not None and time.monotonic() >= deadline:
            proc.terminate()
            try:
                out, err = proc.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            return out, err, True
        show(progress_lines(progress), label)


def forget(folder: str, progress: str) -> None:
    """Remove the progress file (and the .tmp its writer renames from) and the folder made for it; anything
    else found there is not ours to delete, so the folder then stays."""
    for path in (progress, f"{progress}.tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def show(lines: list[str], label: str) -> None:
    for line in lines:
        display.display(f"{label}: {line}" if label else line)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True
    _VALID_ARGS = frozenset(("argv", "chdir", "stdin", "progress", "progress_label", "progress_every",
                             "timeout", "fact", "show"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _, args = self.validate_argument_spec(argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "chdir": {"type": "path"},
            "stdin": {"type": "str"},
            "progress": {"type": "bool", "default": False},
            "progress_label": {"type": "str", "default": ""},
            "progress_every": {"type": "float", "default": 3.0},
            "timeout": {"type": "int", "default": 0},
            "fact": {"type": "str", "default": ""},
            "show": {"type": "bool", "default": False},
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
        folder = tempfile.mkdtemp(prefix="ddplab-progress-") if args["progress"] else None
        progress = os.path.join(folder, "progress.json") if folder else None
        start = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(argv + (["--progress", progress] if progress else []), cwd=chdir,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True)
            except OSError as e:
                raise AnsibleActionFail(f"ddplab_control: cannot run {argv[0]}: {e}") from None
            with proc:
                out, err, timed_out = follow(proc, args.get("stdin") or "", progress, args["progress_label"],
                                             max(args["progress_every"], 0.1), args["timeout"])
            last = progress_lines(progress) if progress else []
            show(last, args["progress_label"])  # the final line: what was sent, how fast
        finally:
            if folder:
                forget(folder, progress)
        out, err = out.rstrip("\n"), err.rstrip("\n")
        if timed_out:
            stopped = f"ddplab: error: {argv[0]} was stopped after {args['timeout']} s"
            err = f"{err}\n{stopped}" if err else stopped
        rc = proc.returncode
        if args["show"]:
            show((out if rc == 0 else err).splitlines(), "")
        result.update(
            cmd=argv, rc=rc, stdout=out, stderr=err, stdout_lines=out.splitlines(),
            stderr_lines=err.splitlines(), delta=f"{time.monotonic() - start:.3f}", changed=True,
            failed=rc != 0)
        if progress:
            result["progress_lines"] = last
        if rc != 0:
            result["msg"] = "non-zero return code"
        elif args["fact"]:
            try:
                result["ansible_facts"] = {args["fact"]: json.loads(out)}
            except ValueError as e:
                raise AnsibleActionFail(
                    f"ddplab_control: {argv[0]} printed no JSON for {args['fact']}: {e}") from None
        return result
