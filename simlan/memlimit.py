"""`--mem-limit node1=1536M`: a host with that much memory, like a small laptop.

Each host given a limit gets its own cgroup in the memory controller, `simlan<lab>/<host>`, whose limit
covers PID 1 and every descendant (sshd, logins, anything started over SSH) and processes started from
outside with `simlan exec`: a process that would take the host over it is killed by the kernel's OOM
killer, as on a real machine that runs out of memory (simulated hosts have no swap of their own: the
limit includes swap where the kernel accounts it).

cgroup v2 (`/sys/fs/cgroup` is cgroup2 and offers the memory controller): `memory.max` (and
`memory.swap.max` = 0), with `+memory` in the parents' `cgroup.subtree_control`. On a hybrid machine whose
memory controller is still bound to a cgroup v1 hierarchy (as here: /sys/fs/cgroup/memory), the same
limit is `memory.limit_in_bytes` (and `memory.memsw.limit_in_bytes` where swap is accounted).
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from simlan import cpuquota, network
from simlan.errors import SimlanError

V2_ROOT = cpuquota.V2_ROOT
MIN_BYTES = 32 << 20  # below this sshd and a Python login do not start
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse(specs: list[str] | tuple[str, ...], hosts: list[str]) -> dict[str, int]:
    """["node1=1536M"] -> {"node1": 1610612736}; a bad spec raises SimlanError (exit 2)."""
    limits: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", value, re.IGNORECASE)
        if not sep or not m:
            raise SimlanError(f"--mem-limit {spec!r}: not HOST=SIZE; use e.g. --mem-limit node1=1536M (K, M, "
                              "G: binary units)", code=2)
        name, size = name.strip(), int(m.group(1)) * _UNITS[m.group(2).upper()]
        if name not in hosts:
            raise SimlanError(f"--mem-limit {spec!r}: no host {name!r} (hosts: {', '.join(hosts)}); name one "
                              "of them", code=2)
        if size < MIN_BYTES:
            raise SimlanError(f"--mem-limit {spec!r}: below {MIN_BYTES >> 20}M a host's sshd and logins do "
                              "not start; give at least that", code=2)
        limits[name] = size
    return limits


def _v1_memory_mount() -> Path | None:
    """Mount point of the cgroup v1 hierarchy that holds the memory controller, or None."""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if fields and fields[0] == "cgroup" and "memory" in fields[2].split(","):
                return Path(pre.split()[4])
    return None


def backend() -> tuple[str, Path]:
    """("v2", /sys/fs/cgroup) or ("v1", <memory hierarchy>); SimlanError when neither offers memory."""
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return "v2", V2_ROOT
    v1 = _v1_memory_mount()
    if v1 is not None:
        return "v1", v1
    raise SimlanError("--mem-limit: this kernel offers no memory cgroup controller (neither cgroup v2 "
                      "memory.max nor a v1 memory hierarchy); run without --mem-limit", code=2)


def mount_spec() -> str:
    """"TYPE OPTIONS MOUNTPOINT" of the file system that holds the memory controller (a host's init.sh
    mounts it again, read-only, so the host sees its own limit as a real machine does)."""
    kind, root = backend()
    if kind == "v2":
        return f"cgroup2 rw {root}"
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if fields and fields[0] == "cgroup" and Path(pre.split()[4]) == root:
                return f"cgroup {fields[2]} {root}"
    raise SimlanError(f"--mem-limit: {root} is no longer mounted; run without --mem-limit", code=2)


def create(host: str, size: int) -> str:
    """Make the host's memory cgroup with its limit; return its path (recorded in cluster.json)."""
    kind, root = backend()
    lab = root / f"simlan{network.LAB}"
    path = lab / host
    if kind == "v2":
        _enable_memory(root)
        lab.mkdir(exist_ok=True)
        _enable_memory(lab)
        path.mkdir(exist_ok=True)
        (path / "memory.max").write_text(str(size))
        with contextlib.suppress(OSError):  # no swap accounting: nothing to limit
            (path / "memory.swap.max").write_text("0")
    else:
        lab.mkdir(exist_ok=True)
        path.mkdir(exist_ok=True)
        (path / "memory.limit_in_bytes").write_text(str(size))
        with contextlib.suppress(OSError):  # memsw exists only with swap accounting (>= the limit above)
            (path / "memory.memsw.limit_in_bytes").write_text(str(size))
    return str(path)


def _enable_memory(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if "memory" not in control.read_text().split():
        control.write_text("+memory")


def limit(path: str | None) -> int | None:
    """The limit in force in a memory cgroup, in bytes (None: no cgroup or no limit)."""
    if not path:
        return None
    p = Path(path)
    try:
        raw = (p / "memory.max" if (p / "memory.max").exists() else p / "memory.limit_in_bytes").read_text()
    except OSError:
        return None
    raw = raw.strip()
    if raw == "max" or int(raw) >= 1 << 62:  # v1 writes "no limit" as a page-rounded LONG_MAX
        return None
    return int(raw)


def peak(path: str | None) -> int | None:
    """The most memory the cgroup has held, in bytes (v1 memory.max_usage_in_bytes, v2 memory.peak where
    the kernel has it); None when unknown."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            return int(Path(path, name).read_text().split()[0])
    return None


def join(path: str, pid: int = 0) -> None:
    cpuquota.join(path, pid)


def remove(path: str | None, timeout: float = 5.0) -> None:
    cpuquota.remove(path, timeout)
