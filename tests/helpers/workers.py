"""Parallel test workers (pytest-xdist): each worker gets a simlan lab of its own.

simlan reads SIMLAN_LAB once, at import, so this runs in conftest before simlan is imported. Worker
gwN uses lab N+1; lab 0 (the plain names and `inventory/simlan`) stays free for the README test, which
runs `python -m simlan up` and `-i inventory/simlan` exactly as a reader types them."""

from __future__ import annotations

import os

MAX_LAB = 9  # simlan's labs are 0-9 (simlan/network.py)


def worker_lab(worker: str | None) -> int | None:
    """The lab of xdist worker `worker` ("gw0" -> 1), or None outside xdist."""
    if not worker:
        return None
    index = int(worker.removeprefix("gw"))
    if index + 1 > MAX_LAB:
        raise SystemExit(f"tests: at most {MAX_LAB} parallel workers (one simlan lab each); got {worker}")
    return index + 1


def use_own_simlan_lab() -> None:
    lab = worker_lab(os.environ.get("PYTEST_XDIST_WORKER"))
    if lab is not None:
        os.environ["SIMLAN_LAB"] = str(lab)


# Test files that run in one worker, one after the other in this order, on one simulated cluster that
# tests/stock/conftest.py brings up once: {file: the cluster they share}. The ddplab module prepares the
# bare stock hosts (and proves that from bare), the Slurm module then builds Slurm on those hosts.
SHARED_CLUSTER = {"tests/stock/test_stock_ddplab.py": "stock hosts",
                  "tests/stock/test_slurm.py": "stock hosts"}


def file_of(nodeid: str) -> str:
    """The file of a test id ("tests/a/test_b.py::test_c[x]" -> "tests/a/test_b.py")."""
    return nodeid.split("::", 1)[0]


def unit_of_work(nodeid: str) -> str:
    """What one worker runs as a whole under `--dist loadfile`: the test's file, or the name of the
    cluster its file shares with others (SHARED_CLUSTER)."""
    return SHARED_CLUSTER.get(file_of(nodeid), file_of(nodeid))


def shared_cluster_scheduling(config, log):
    """xdist's loadfile scheduling, the files of one SHARED_CLUSTER entry handed to a worker as one unit.
    Inside a unit the worker runs the tests in collection order (tests/conftest.py sorts the files)."""
    from xdist.scheduler import LoadFileScheduling

    class SharedClusterScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return SharedClusterScheduling(config, log)
