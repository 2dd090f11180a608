"""Shared pytest fixtures. Simulated hosts (simlan) for any test that needs "other machines".

Usage in a test file (mark it ``simlan``; the fixtures skip the test when not root or a tool
such as sshd is missing, naming what is missing)::

    import pytest
    pytestmark = pytest.mark.simlan

    def test_prepare(simlan2):                 # a 2-host cluster, up and healthy
        inv = simlan2.inventory_dir            # inventory/simlan: hosts.yml + group_vars/all/simlan.yml
        simlan2.exec("node1", ["hostname"])    # run inside a host (timeout=60 s by default)
        simlan2.ssh_argv("node0", "uptime")    # an OpenSSH command line that logs into a host

    def test_big(simlan_cluster):              # the session factory, for other shapes
        c = simlan_cluster(3, rate="1gbit", cpus="auto")

- ``simlan_cluster`` (session scope) is a factory ``(nodes=2, *, rate=None, cpus="none",
  fresh=False, mem_limit=()) -> simlan.cluster.Cluster`` (mem_limit: ``("node1=256M", ...)``). One
  cluster exists at a time: it is reused while tests ask for the same shape and it is healthy, and
  recreated otherwise (about 0.5 s for 2 hosts).
  ``fresh=True`` always recreates. A test that leaves a host changed (ufw enabled, host killed,
  files written into the lab folder) calls ``simlan_cluster.discard()`` at its end, so the next
  test gets clean hosts. At the end of each test file the hosts are also taken down when its tests
  left them changed (tests/helpers/leftovers.py), so no file takes another file's leftovers.
- At the first use in a session, a leftover cluster from an earlier run is taken down, unless the
  pytest process that made it is still running (then this session waits for it, up to 5 min).
  At the end of the session the cluster is taken down.
- The inventory written is ``inventory/simlan/`` (the same one ``python -m simlan up`` writes), so
  ``ansible-playbook -i inventory/simlan ...`` works in a test; ``ansible_python_interpreter`` is
  the repo's ``.venv/bin/python`` (the Python running pytest), visible inside every host.
- Under pytest-xdist (``make test`` runs files in parallel workers) each worker has its own lab:
  worker ``gwN`` uses ``SIMLAN_LAB=N+1`` (bridge ``lab<N+1>``, ``inventory/simlan<N+1>``). Lab 0 and
  ``inventory/simlan`` are left to the README test, which runs the README's commands as typed.
- ``simlan_cli(*args, timeout=60, input=None)`` runs ``python -m simlan ...`` and returns the
  CompletedProcess (text, captured).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import leftovers
from tests.helpers.inventories import require_clean_inventory
from tests.helpers.workers import SHARED_CLUSTER, file_of, shared_cluster_scheduling, use_own_simlan_lab

use_own_simlan_lab()  # before simlan is imported: it reads SIMLAN_LAB once

from simlan import cluster as simlan  # noqa: E402
from simlan import memlimit  # noqa: E402
from simlan.system import cmdline, missing_requirements  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.helpers.cpu_profile"]  # DDPLAB_TEST_CPU=DIR: CPU seconds per test

LEFTOVER_WAIT_S = 300


def simlan_skip_reason() -> str | None:
    """Why simlan tests cannot run here (not root, a tool missing), or None."""
    problem = missing_requirements()
    return f"simlan: {problem}" if problem else None


class SimlanFactory:
    """Brings simulated clusters up on demand; see the module docstring."""

    def __init__(self) -> None:
        self.cluster: simlan.Cluster | None = None
        self._checked_leftover = False
        self._asked = False  # a test asked for hosts since the last discard_if_changed

    def __call__(self, nodes: int = 2, *, rate: str | None = None, cpus: str = "none",
                 fresh: bool = False, mem_limit: tuple[str, ...] = ()) -> simlan.Cluster:
        reason = simlan_skip_reason()
        if reason:
            pytest.skip(reason)
        self._asked = True
        if not self._checked_leftover:
            self._remove_leftover()
            self._checked_leftover = True
        current = simlan.load()
        same = (current is not None and current.created_by == os.getpid() and not current.stock
                and (len(current.hosts), current.rate, current.cpus) == (nodes, rate, cpus)
                and current.mem_limit == memlimit.parse(mem_limit, [h.name for h in current.hosts]))
        if same and not fresh and current.healthy():
            self.cluster = current
        else:
            self.cluster = simlan.up(nodes, rate=rate, cpus=cpus, force=True, mem_limit=mem_limit)
        require_clean_inventory(self.cluster.inventory_dir)
        return self.cluster

    def discard_if_changed(self) -> None:
        """At the end of a test file: take its hosts down when its tests left them changed (tests/helpers/
        leftovers.py) or broken; the next file gets the hosts only as `simlan up` made them. Files that asked
        for no hosts are not checked (about 65 ms for 2 hosts)."""
        asked, self._asked = self._asked, False
        if not asked:
            return
        current = simlan.load()
        if not (self.cluster is not None and current is not None and not current.stock
                and (current.created_by, current.created_at) == (os.getpid(), self.cluster.created_at)):
            return  # not this factory's hosts (none, stock hosts, another run's)
        try:
            changed = not current.healthy() or leftovers.changes(current)
        except OSError:  # a host folder that cannot be read is not as `simlan up` made it either
            changed = True
        if changed:
            self.discard()

    def discard(self) -> None:
        """Take the current cluster down (the next request gets fresh hosts)."""
        if self.cluster is not None:
            current = simlan.load()
            if current is not None and current.created_by == os.getpid():
                simlan.down()
            self.cluster = None

    def close(self) -> None:
        self.discard()

    @staticmethod
    def _remove_leftover() -> None:
        deadline = time.monotonic() + LEFTOVER_WAIT_S
        while True:
            left = simlan.load()
            if left is None:
                return
            owner = left.created_by
            in_use = owner != os.getpid() and any("pytest" in a for a in cmdline(owner))
            if not in_use:
                simlan.down()
                return
            if time.monotonic() > deadline:
                pytest.fail(f"a simlan cluster is in use by another pytest run (pid {owner}) for more "
                            f"than {LEFTOVER_WAIT_S} s; wait for it or run `python -m simlan down`")
            time.sleep(2)


FACTORY: SimlanFactory | None = None  # the session's, for the end of each test file (pytest_runtest_teardown)


@pytest.fixture(scope="session")
def simlan_cluster():
    global FACTORY
    factory = FACTORY = SimlanFactory()
    yield factory
    factory.close()
    FACTORY = None


@pytest.fixture
def simlan2(simlan_cluster) -> simlan.Cluster:
    """A healthy 2-host cluster (node0 = master at 10.77.0.10, node1 at 10.77.0.11)."""
    return simlan_cluster(2)


@pytest.fixture
def skip_unless_simlan() -> None:
    """Skip the test unless simlan can run here (root, tools)."""
    reason = simlan_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def simlan_cli():
    """Run `python -m simlan ARGS...` from the repo with a wall-clock timeout."""

    def run(*args: str, timeout: float = 60, input: str | None = None) -> subprocess.CompletedProcess:
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        return subprocess.run([sys.executable, "-m", "simlan", *args], cwd=REPO, env=env, text=True,
                              capture_output=True, timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)

    return run


# Files started first, in this order: the two elastic runs (minutes spent mostly waiting for timeouts,
# so they overlap well with busy workers; started last they left the CPU idle for minutes), then the
# longest files of a full run (5-10 min each with 3 workers on 2 cores; `make test` prints the slowest).
FIRST = ("tests/resilience/test_elastic_simlan.py", "tests/trainer/test_elastic_run.py",
         "tests/stock/test_stock_ddplab.py", "tests/orchestrator/test_limit_simlan.py",
         "tests/test_readme.py", "tests/byo/test_byo_simlan.py", "tests/byo/test_nanochat_simlan.py",
         "tests/resilience/test_simlan_resilience.py")


# Importing ansible (a filter plugin under test) replaces sys.intern with its own patch, which a later
# torch._dynamo import in the same worker refuses ("substitute_in_graph expects a function"): every test
# ends with the interpreter's own.
BUILTIN_INTERN = sys.intern


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the test's fixtures are torn down: the interpreter's own sys.intern back, and, when the test
    file ends, its simulated hosts taken down if its tests left them changed (a later file of this worker
    would otherwise take them as they are)."""
    yield
    if sys.intern is not BUILTIN_INTERN:
        sys.intern = BUILTIN_INTERN
    if FACTORY is not None and nextitem is not None and file_of(nextitem.nodeid) != file_of(item.nodeid):
        FACTORY.discard_if_changed()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile` (`make test`): the files that share one cluster (SHARED_CLUSTER) go to one worker."""
    return shared_cluster_scheduling(config, log) if config.getvalue("dist") == "loadfile" else None


def pytest_collection_modifyitems(items):
    """Longest first: the files in FIRST, the other files of simulated hosts, the other slow ones, then the
    quick rest. Parallel workers (`make test`) take files in this order, so no long file starts last while
    the others sit idle. The order inside a file is kept (its module fixtures rely on it). Files that share
    a cluster (SHARED_CLUSTER) run back to back in that constant's order, where the first of them sorts."""
    by_file: dict[str, int] = {}
    seen: dict[str, int] = {}  # collection order of the files
    for item in items:
        path = file_of(item.nodeid)
        by_file[path] = max(by_file.get(path, 0), weight(item))
        seen.setdefault(path, len(seen))
    sharing = list(SHARED_CLUSTER)

    def lead(path: str) -> str:
        """The file whose place the file's tests take: itself, or the first file sharing its cluster."""
        return next(f for f in sharing if f in seen and SHARED_CLUSTER[f] == SHARED_CLUSTER[path]) \
            if path in SHARED_CLUSTER else path

    def key(item) -> tuple[int, int, int, int]:
        path = file_of(item.nodeid)
        first = lead(path)
        rank = (FIRST.index(first), 0) if first in FIRST else (len(FIRST), -by_file[first])
        return (*rank, seen[first], sharing.index(path) if path in SHARED_CLUSTER else 0)

    items.sort(key=key)  # stable: the order inside a file is kept


def weight(item) -> int:
    """2 for tests of simulated hosts, 1 for the other slow ones, 0 for the rest."""
    return 2 if item.get_closest_marker("simlan") else 1 if item.get_closest_marker("slow") else 0
