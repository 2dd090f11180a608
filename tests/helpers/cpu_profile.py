"""CPU seconds per test, for finding what makes the suite slow: `DDPLAB_TEST_CPU=DIR make test` (root).

On a machine where the CPU is the limit (`make test` runs 3 workers on 2 cores), a test's wall time says more
about what ran beside it than about its own cost. With DDPLAB_TEST_CPU set, each pytest process moves itself
into a cgroup of its own (`ddplab-test-<worker>`); everything it starts is born there, the simulated hosts of
its lab included (their init, sshd and every rank started over SSH), so the cgroup's CPU counter read before
and after a test is that test's CPU, module fixtures included (they are set up within the first test that
asks and torn down within the last). Each process appends `nodeid<TAB>cpu_s<TAB>wall_s` lines to
DIR/<worker>.tsv; `python -m tests.helpers.cpu_profile DIR` sums them by file and lists the costliest tests.

cgroup v1 (the cpuacct hierarchy) and v2 (cpu.stat) both work; without root or cgroups the variable is
refused at start with the reason.
"""

from __future__ import annotations

import collections
import os
import sys
import time
from pathlib import Path

import pytest

ENV = "DDPLAB_TEST_CPU"
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


def cgroup_for(name: str) -> tuple[Path, str]:
    """Create (or reuse) the cgroup `name`; return it and its CPU counter file."""
    if (V1 / "cpuacct.usage").exists():
        group, counter = V1 / name, "cpuacct.usage"
    elif (V2 / "cgroup.controllers").exists():
        group, counter = V2 / name, "cpu.stat"
    else:
        raise pytest.UsageError(f"{ENV}: no cgroup CPU counter on this machine (cgroup v1 cpuacct or v2)")
    try:
        group.mkdir(exist_ok=True)
        (group / "cgroup.procs").write_text(f"{os.getpid()}\n")
    except OSError as e:
        raise pytest.UsageError(f"{ENV}: cannot use cgroup {group} ({e}); it needs root") from e
    return group, counter


def cpu_seconds(group: Path, counter: str) -> float:
    text = (group / counter).read_text()
    if counter == "cpuacct.usage":
        return int(text) / 1e9
    return next(int(v) for k, v in (ln.split() for ln in text.splitlines()) if k == "usage_usec") / 1e6


class CpuProfile:
    def __init__(self, folder: Path, worker: str):
        self.group, self.counter = cgroup_for(f"ddplab-test-{worker}")
        folder.mkdir(parents=True, exist_ok=True)
        self.out = (folder / f"{worker}.tsv").open("a", buffering=1)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        cpu, wall = cpu_seconds(self.group, self.counter), time.monotonic()
        yield
        self.out.write(f"{item.nodeid}\t{cpu_seconds(self.group, self.counter) - cpu:.1f}\t"
                       f"{time.monotonic() - wall:.1f}\n")


def pytest_configure(config):
    folder = os.environ.get(ENV)
    if folder:
        worker = getattr(config, "workerinput", {}).get("workerid", "main")
        config.pluginmanager.register(CpuProfile(Path(folder), worker), "ddplab-cpu-profile")


def summary(folder: Path, top: int = 25) -> str:
    """CPU-seconds by test file, then the costliest tests, from the .tsv files in `folder`."""
    by_file, count, tests = collections.Counter(), collections.Counter(), []
    for tsv in sorted(folder.glob("*.tsv")):
        for line in tsv.read_text().splitlines():
            nodeid, cpu, wall = line.split("\t")
            by_file[nodeid.split("::")[0]] += float(cpu)
            count[nodeid.split("::")[0]] += 1
            tests.append((float(cpu), float(wall), nodeid))
    out = [f"{sum(by_file.values()):.0f} CPU-s in {len(tests)} tests", "", "CPU-s  tests  file"]
    out += [f"{cpu:6.1f} {count[f]:5d}  {f}" for f, cpu in by_file.most_common(top)]
    out += ["", "CPU-s  wall-s  test"]
    out += [f"{cpu:6.1f} {wall:6.1f}  {nodeid}" for cpu, wall, nodeid in sorted(tests, reverse=True)[:top]]
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(Path(sys.argv[1])))
