"""simlan's Python API in one import (what tests and the CLI use)::

    from simlan import cluster
    c = cluster.up(2)       # or cluster.load() for the running one
    c.exec("node1", ["hostname"]); c.ssh_argv("node0", "uptime"); c.status()
    cluster.down()

The parts live in their own modules: the recorded cluster and its hosts (simlan.hosts), creating and
removing it (simlan.lifecycle), failures on purpose (simlan.faults), what a root host keeps visible
(simlan.keep) and the port-22 probe (simlan.probe)."""

from __future__ import annotations

from simlan.defaults import DEFAULT_INVENTORY, DEFAULT_SYN_RETRIES, READY_TIMEOUT, REPO_ROOT, SSHD
from simlan.hosts import Cluster, Host
from simlan.keep import keep_paths, keep_tmp_paths, venv_python
from simlan.lifecycle import down, load, up
from simlan.probe import ssh_answers

__all__ = [
    "DEFAULT_INVENTORY", "DEFAULT_SYN_RETRIES", "READY_TIMEOUT", "REPO_ROOT", "SSHD", "Cluster", "Host",
    "down", "keep_paths", "keep_tmp_paths", "load", "ssh_answers", "up", "venv_python",
]
