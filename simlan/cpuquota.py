"""`--cpu-quota node1=50`: a host that runs at 50 % of one core, like a slower laptop.

Each host given a quota gets its own cgroup, `simlan<lab>/<host>`, with CFS bandwidth control:
quota = percent × 1000 µs per 100 000 µs period. The host's unshare process joins it before it
starts PID 1, so PID 1 and every descendant (sshd, logins, anything started over SSH) are in it;
processes started from outside with `simlan exec` join it too.

cgroup v2 (`/sys/fs/cgroup` is cgroup2 and offers the cpu controller): `cpu.max` = "QUOTA 100000",
with `+cpu` in the parents' `cgroup.subtree_control`. On a hybrid machine whose cpu controller is
still bound to a cgroup v1 hierarchy (as here: /sys/fs/cgroup/cpu), the same CFS limit is set
through `cpu.cfs_period_us` and `cpu.cfs_quota_us` of that hierarchy; a controller cannot be on both.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from simlan import network
from simlan.errors import SimlanError

PERIOD_US = 100_000
V2_ROOT = Path("/sys/fs/cgroup")


def parse(specs: list[str] | tuple[str, ...], hosts: list[str]) -> dict[str, int]:
    """["node1=50"] -> {"node1": 50}; a bad spec raises SimlanError (exit 2)."""
    limit = 100 * (os.cpu_count() or 1)
    quotas: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.partition("=")
        if not sep or not value.strip().isdigit():
            raise SimlanError(f"--cpu-quota {spec!r}: not HOST=PERCENT; use e.g. --cpu-quota node1=50",
                              code=2)
        name, percent = name.strip(), int(value)
        if name not in hosts:
            raise SimlanError(f"--cpu-quota {spec!r}: no host {name!r} (hosts: {', '.join(hosts)}); "
                              "name one of them", code=2)
        if not 1 <= percent <= limit:
            raise SimlanError(f"--cpu-quota {spec!r}: {percent} % is outside 1-{limit} (100 = one core, "
                              f"{os.cpu_count()} cores here); give a percent in that range", code=2)
        quotas[name] = percent
    return quotas


def _v1_cpu_mount() -> Path | None:
    """Mount point of the cgroup v1 hierarchy that holds the cpu controller, or None."""
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if fields and fields[0] == "cgroup" and "cpu" in fields[2].split(","):
                return Path(pre.split()[4])
    return None


def backend() -> tuple[str, Path]:
    """("v2", /sys/fs/cgroup) or ("v1", <cpu hierarchy>); SimlanError when neither offers cpu."""
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2", V2_ROOT
    v1 = _v1_cpu_mount()
    if v1 is not None:
        return "v1", v1
    raise SimlanError("--cpu-quota: this kernel offers no cpu cgroup controller (neither cgroup v2 "
                      "cpu.max nor a v1 cpu hierarchy); run without --cpu-quota", code=2)


def settings(percent: int) -> dict[str, str]:
    """The files and values that make `percent` of one core, for each backend."""
    quota = percent * PERIOD_US // 100
    return {"v2": f"{quota} {PERIOD_US}", "v1_period": str(PERIOD_US), "v1_quota": str(quota)}


def create(host: str, percent: int) -> str:
    """Make the host's cgroup with its limit; return its path (recorded in cluster.json)."""
    kind, root = backend()
    lab = root / f"simlan{network.LAB}"
    path = lab / host
    want = settings(percent)
    if kind == "v2":
        _enable_cpu(root)
        lab.mkdir(exist_ok=True)
        _enable_cpu(lab)
        path.mkdir(exist_ok=True)
        (path / "cpu.max").write_text(want["v2"])
    else:
        lab.mkdir(exist_ok=True)
        path.mkdir(exist_ok=True)
        (path / "cpu.cfs_period_us").write_text(want["v1_period"])
        (path / "cpu.cfs_quota_us").write_text(want["v1_quota"])
    return str(path)


def _enable_cpu(group: Path) -> None:
    control = group / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def join(path: str, pid: int = 0) -> None:
    """Move a process (0: the caller) into the cgroup; its children are born there."""
    Path(path, "cgroup.procs").write_text(f"{pid or os.getpid()}\n")


def percent(path: str | None) -> int | None:
    """The limit in force in a cgroup, as percent of one core (None: no cgroup or no limit)."""
    if not path:
        return None
    p = Path(path)
    try:
        if (p / "cpu.max").exists():
            quota, period = (p / "cpu.max").read_text().split()
        else:
            quota = (p / "cpu.cfs_quota_us").read_text().strip()
            period = (p / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    if quota in ("max", "-1"):
        return None
    return round(100 * int(quota) / int(period))


def members(path: str) -> list[int]:
    try:
        return [int(x) for x in Path(path, "cgroup.procs").read_text().split()]
    except OSError:
        return []


def remove(path: str | None, timeout: float = 5.0) -> None:
    """Remove the host's cgroup once its processes are gone, and the lab's when it is empty."""
    if not path or not Path(path).exists():
        return
    deadline = time.monotonic() + timeout
    while True:
        try:
            Path(path).rmdir()
            break
        except OSError as exc:  # EBUSY while the killed processes are still being reaped
            if time.monotonic() > deadline:
                raise SimlanError(f"{path}: cannot remove the cgroup ({exc}); processes still in it: "
                                  f"{members(path)}") from exc
            time.sleep(0.05)
    with contextlib.suppress(OSError):  # another host's cgroup is still there
        Path(path).parent.rmdir()
