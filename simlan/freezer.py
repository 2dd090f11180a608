"""`simlan freeze node1` / `simlan thaw node1`: a laptop whose lid closes, then opens again.

Every process of the host (PID 1, sshd, logins, ranks) stops where it is, as in suspend: it runs no
instruction, answers nothing (its sockets stay open, the kernel still completes TCP handshakes for its
listeners, so a peer's connect succeeds and then hears nothing) and resumes on thaw with its state whole.
The host's processes are moved into its cgroup `simlan<lab>/<host>` at freeze time and stay there after
the thaw; `down` thaws and removes it.

cgroup v2 (a cgroup2 mount: `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid machine, as here):
`cgroup.freeze` = 1, frozen when `cgroup.events` says `frozen 1`. The freezer is part of cgroup v2 itself
(no controller to enable), and a hybrid machine's unified tree holds every process too. Where the kernel
has no cgroup2 mount, the v1 freezer hierarchy: `freezer.state` = FROZEN.
On a pure v2 machine the group is the one --cpu-quota and --mem-limit use, so their limits stay in force.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from simlan import cpuquota, network
from simlan.errors import SimlanError
from simlan.system import is_zombie

FREEZE_TIMEOUT = 10.0  # seconds for the kernel to stop every task (a task in an uninterruptible sleep waits)


def _mounts() -> list[tuple[str, Path, list[str]]]:
    """(fstype, mount point, super options) of every cgroup mount."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if fields and fields[0] in ("cgroup", "cgroup2"):
                out.append((fields[0], Path(pre.split()[4]), fields[2].split(",")))
    return out


def backend() -> tuple[str, Path]:
    """("v2", the cgroup2 mount) or ("v1", the freezer hierarchy); SimlanError when neither exists."""
    mounts = _mounts()
    for kind, path, _ in mounts:
        if kind == "cgroup2" and (path / "cgroup.procs").exists():
            return "v2", path
    for kind, path, options in mounts:
        if kind == "cgroup" and "freezer" in options:
            return "v1", path
    raise SimlanError("freeze: this kernel offers no cgroup freezer (no cgroup2 mount, no v1 freezer "
                      "hierarchy); simulate a lost host with kill-host instead", code=2)


def _frozen(kind: str, path: Path) -> bool:
    if kind == "v2":
        return "frozen 1" in (path / "cgroup.events").read_text().splitlines()
    return (path / "freezer.state").read_text().strip() == "FROZEN"


def _set(kind: str, path: Path, frozen: bool) -> None:
    if kind == "v2":
        (path / "cgroup.freeze").write_text("1" if frozen else "0")
    else:
        (path / "freezer.state").write_text("FROZEN" if frozen else "THAWED")


def _members(path: Path) -> set[int]:
    try:
        return {int(x) for x in (path / "cgroup.procs").read_text().split()}
    except OSError:
        return set()


def _move(path: Path, pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, OSError):  # gone meanwhile: nothing to freeze
            (path / "cgroup.procs").write_text(f"{pid}\n")


def freeze(host: str, processes: Callable[[], list[int]], timeout: float = FREEZE_TIMEOUT) -> str:
    """Freeze every process `processes()` lists (the host's PID namespace); returns the cgroup's path.
    A process forked while the others are moved is born in its parent's group (the moved one, or the old
    one, which the next round catches): the rounds end when every process of the host is in the group.
    A zombie is left out: it runs nothing, no cgroup lists it, and a frozen parent never reaps it (a child
    that exited just after its parent was moved waited there until the timeout)."""
    kind, root = backend()
    path = root / f"simlan{network.LAB}" / host
    path.mkdir(parents=True, exist_ok=True)
    _set(kind, path, True)
    deadline = time.monotonic() + timeout
    while True:
        outside = [p for p in processes() if p not in _members(path) and not is_zombie(p)]
        if not outside and _frozen(kind, path):
            return str(path)
        if time.monotonic() > deadline:
            raise SimlanError(f"{host}: not frozen within {timeout:g} s ({len(outside)} process(es) still "
                              f"outside {path}); run `simlan thaw {host}`")
        _move(path, outside)  # a process moved into a frozen group stops there
        time.sleep(0.02)


def thaw(path: str | None) -> None:
    """Let the frozen processes run on (nothing to do when the group is gone)."""
    if not path or not Path(path).exists():
        return
    kind, _ = backend()
    _set(kind, Path(path), False)


def frozen(path: str | None) -> bool:
    if not path or not Path(path).exists():
        return False
    kind, _ = backend()
    return _frozen(kind, Path(path))


def remove(path: str | None, timeout: float = 5.0) -> None:
    """Thaw the host's group, then remove it as every simlan cgroup goes (cpuquota.remove: once its
    processes are gone, and the lab's when it is empty)."""
    if not path or not Path(path).exists():
        return
    thaw(path)
    cpuquota.remove(path, timeout)
