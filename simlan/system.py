"""What simlan needs from the machine (root, tools) and small helpers over processes and commands."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from simlan.errors import SimlanError

# Tool -> Debian package that provides it (named in the error message when it is missing).
TOOLS = {
    "ip": "iproute2",
    "tc": "iproute2",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "bash": "bash",
    "sshd": "openssh-server",
    "ssh-keygen": "openssh-client",
}
# Root's usual PATH: /usr/sbin is missing from some non-login shells, and sshd, ip and tc live there.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def root_problem() -> str | None:
    """Why simlan cannot run as the current user, or None."""
    if os.geteuid() != 0:
        return (
            "needs root (network namespaces, a bridge and mounts need CAP_SYS_ADMIN and CAP_NET_ADMIN); "
            "run it as root, e.g. `sudo .venv/bin/python -m simlan ...`"
        )
    return None


def which(tool: str) -> str | None:
    """Absolute path of a tool, searching PATH and then root's usual system directories."""
    return shutil.which(tool, path=f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}")


def missing_tools(tools: dict[str, str] | None = None) -> str | None:
    """One line naming every missing tool and the Debian packages that provide them, or None."""
    tools = TOOLS if tools is None else tools
    missing = {name: pkg for name, pkg in tools.items() if which(name) is None}
    if not missing:
        return None
    pkgs = sorted(set(missing.values()))
    names = ", ".join(f"`{n}`" for n in missing)
    return f"missing {names}; install the Debian package(s): apt-get install -y {' '.join(pkgs)}"


def missing_requirements() -> str | None:
    """Why simlan cannot work here (not root, or tools missing), or None. Used by tests to skip."""
    return root_problem() or missing_tools()


def require() -> dict[str, str]:
    """Raise SimlanError (exit 2) unless root with every tool; return tool -> absolute path."""
    problem = missing_requirements()
    if problem:
        raise SimlanError(problem, code=2)
    return {name: which(name) for name in TOOLS}  # type: ignore[misc]


def run(cmd: list[str], *, timeout: float = 30, check: bool = True, what: str | None = None,
        **kwargs) -> subprocess.CompletedProcess:
    """Run a command, capture its output; on failure raise SimlanError naming it and its stderr."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired as exc:
        raise SimlanError(f"{what or shlex.join(cmd)}: no answer after {timeout:g} s") from exc
    if check and proc.returncode != 0:
        err = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()[-1]
        raise SimlanError(f"{what or shlex.join(cmd)} failed: {err}")
    return proc


# ---- processes, identified by PID and start time so a reused PID is never mistaken for ours ----

def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    return raw[raw.rindex(")") + 2:].split()


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields else None


def is_alive(pid: int | None, started: int | None) -> bool:
    """True when PID is running (not a zombie) and is the process that started at `started`."""
    if not pid:
        return False
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] != "Z" and int(fields[19]) == started


def is_zombie(pid: int) -> bool:
    """True when PID has exited and waits for its parent to reap it (state Z)."""
    fields = _stat_fields(pid)
    return bool(fields) and fields[0] == "Z"


def children(pid: int) -> list[int]:
    """Direct children of a process (all its threads)."""
    kids: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids += [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
    return kids


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def pid_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def processes_in_pid_namespace(pid1: int) -> list[int]:
    """Every process (global PID) that shares the PID namespace of `pid1`."""
    ns = pid_namespace(pid1)
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and pid_namespace(int(entry.name)) == ns:
            found.append(int(entry.name))
    return found


def kill_recorded(pid: int | None, started: int | None, sig: int = signal.SIGKILL) -> bool:
    """Send `sig` to PID only if it is still the recorded process; True if a signal was sent."""
    if not is_alive(pid, started):
        return False
    try:
        os.kill(pid, sig)  # type: ignore[arg-type]
    except ProcessLookupError:
        return False
    return True


def wait_gone(pid: int | None, started: int | None, timeout: float = 5.0) -> bool:
    """Wait until the recorded process has exited (reaping it if it is our child)."""
    deadline = time.monotonic() + timeout
    while is_alive(pid, started):
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:  # type: ignore[arg-type]
                break
        except ChildProcessError:
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    if pid:  # a zombie child of ours: reap it so it does not linger
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
    return True
