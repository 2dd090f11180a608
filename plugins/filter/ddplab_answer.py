"""What a failed command said, for a task's message (the roles write no string surgery on stderr).

    msg: "ddplab: error: ... is missing{{ launch_facts_out | stderr_tail }}"   -> "...: <stderr's last line>"
    msg: "{{ push_status | failure('sending code to node1') }}"
      -> the command's own message (its stderr), else "ddplab: error: sending code to node1 failed: <msg>"
"""

from __future__ import annotations


def _stderr(result) -> str:
    return str((result or {}).get("stderr") or "").strip()


def stderr_tail(result) -> str:
    """': <the last line of stderr>' when the command failed and said something, else ''."""
    said = _stderr(result)
    return f": {said.splitlines()[-1]}" if (result or {}).get("rc") not in (0, None) and said else ""


def failure(result, doing: str) -> str:
    """The failed command's own message (its stderr), else one line naming what failed and why."""
    return _stderr(result) or f"ddplab: error: {doing} failed: {(result or {}).get('msg') or 'no output'}"


class FilterModule:
    def filters(self):
        return {"stderr_tail": stderr_tail, "failure": failure}
