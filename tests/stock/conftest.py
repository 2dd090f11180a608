"""Stock hosts shared by this folder's modules: two `simlan up --stock` hosts (Debian 12 minimal root
filesystems, login `lab` with a sudo password) are slow to make useful (a first prepare pushes the
wheelhouse and installs torch offline on each), so test_stock_ddplab.py takes them bare and prepares
them, and test_slurm.py then builds Slurm on the same hosts. `make test` runs both in one worker, in
that order (tests/helpers/workers.py SHARED_CLUSTER); each module also runs alone."""

from __future__ import annotations

import os
import time

import pytest

from simlan import cluster as simlan
from simlan.system import missing_requirements, which
from tests.helpers.inventories import require_clean_inventory
from tests.helpers.playbooks import ensure_wheelhouse


def stock_skip_reason() -> str | None:
    """Why stock hosts cannot be made here (not root, a tool missing), or None."""
    problem = missing_requirements()
    if problem:
        return f"simlan: {problem}"
    for tool, pkg in (("debootstrap", "debootstrap"), ("iptables", "iptables"), ("ssh", "openssh-client")):
        if which(tool) is None:
            return f"simlan --stock: missing `{tool}` (apt-get install -y {pkg})"
    return None


class StockHosts:
    """Two stock hosts, made once and handed to one test file after another. `users` names the files that
    had the current hosts, in order (none yet: they are bare)."""

    def __init__(self) -> None:
        self.cluster: simlan.Cluster | None = None
        self.users: list[str] = []

    def __call__(self, module: str, *, bare: bool = False) -> simlan.Cluster:
        """The hosts for the test file `module`; `bare`: hosts no file had before (made anew if needed)."""
        reason = stock_skip_reason()
        if reason:
            pytest.skip(reason)
        ensure_wheelhouse()  # `make wheelhouse` without its `setup` prerequisite: prepare pushes it
        if (bare and self.users) or not self._still_up():
            t0 = time.monotonic()
            self.cluster = simlan.up(2, stock=True, force=True, timeout=20)
            self.users = []
            print(f"\nstock hosts: simlan up --stock, 2 hosts, {time.monotonic() - t0:.0f} s")
        require_clean_inventory(self.cluster.inventory_dir)
        self.users.append(module)
        return self.cluster

    def before(self, module: str) -> list[str]:
        """The test files that had the hosts before `module`."""
        return self.users[:self.users.index(module)]

    def _still_up(self) -> bool:
        """The hosts made here are still the lab's cluster (no other fixture replaced them), and healthy."""
        current = simlan.load()
        return (self.cluster is not None and current is not None and current.stock
                and (current.created_by, current.created_at) == (os.getpid(), self.cluster.created_at)
                and current.healthy())

    def close(self) -> None:
        current = simlan.load()
        if self.cluster is not None and current is not None and current.stock \
                and current.created_at == self.cluster.created_at:
            simlan.down()


@pytest.fixture(scope="package")
def stock_hosts():
    """The StockHosts of this folder; the hosts are taken down when its last module is done."""
    hosts = StockHosts()
    yield hosts
    hosts.close()
