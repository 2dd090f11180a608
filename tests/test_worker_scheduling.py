"""`make test`'s parallel workers (tests/conftest.py, tests/helpers/workers.py): the files that share one
simulated cluster reach one worker as one unit, in collection order, and collection puts them back to back
in SHARED_CLUSTER's order where the first of them sorts (FIRST)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

from tests.helpers.playbooks import REPO
from tests.helpers.workers import SHARED_CLUSTER, file_of, shared_cluster_scheduling

STOCK_DIR = "tests/stock"


def collected(*args: str) -> list[str]:
    """The test ids `pytest --collect-only` lists, in the order they would run."""
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if "::" in line]


def test_files_sharing_a_cluster_are_collected_back_to_back_in_their_order():
    ids = collected(STOCK_DIR)
    files = list(dict.fromkeys(file_of(i) for i in ids))
    shared = [f for f in files if f in SHARED_CLUSTER]
    assert shared == list(SHARED_CLUSTER)
    start = files.index(shared[0])
    assert files[start:start + len(shared)] == shared, files


class Worker:
    """What xdist's scheduler talks to for one worker process: the test indexes it was sent."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.shutting_down = False
        self.sent: list[list[int]] = []

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.sent.append(list(indexes))

    def shutdown(self) -> None:
        self.shutting_down = True


def test_the_loadfile_scheduler_hands_a_shared_cluster_to_one_worker_in_order(pytestconfig, monkeypatch):
    ids = collected(STOCK_DIR)
    monkeypatch.setattr(pytestconfig.option, "tx", ["2*popen"])
    monkeypatch.setattr(pytestconfig.option, "loadscopereorder", False)  # as `make test` runs it
    scheduler = shared_cluster_scheduling(pytestconfig, None)
    workers = [Worker("gw0"), Worker("gw1")]
    for w in workers:
        scheduler.add_node(w)
        scheduler.add_node_collection(w, ids)
    scheduler.schedule()
    shared = [i for i in ids if file_of(i) in SHARED_CLUSTER]
    units = [[ids[n] for n in unit] for w in workers for unit in w.sent]
    assert shared in units, units  # one unit, whole, in collection order
    assert units[0] == shared  # the first unit handed out: its files sort first in this folder
