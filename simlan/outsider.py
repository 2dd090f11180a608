"""A host outside the lab, for threat tests: an address on the LAN that no node has and no inventory lists
(10.77.<lab>.250), running a stock host's programs. A test makes its real attempt on a lab's port from
there, as someone on the same network who is not one of the lab's machines would.

    with outsider(cluster, programs_of="node1") as argv:
        subprocess.run(argv + ["bash", "-s"], input=script, ...)

The outside host is a network namespace of its own joined to the bridge; on stock hosts its commands see
the root filesystem of the stock host `programs_of` (its installed packages, its /tmp) through that host's
mount namespace, but none of its network; beside root hosts (which share this machine's files) they run
with this machine's files, as root hosts do (`programs_of` None). The namespace is recorded in the
cluster's state while it exists, so `simlan down` removes it too if a test dies inside the block."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from simlan import network
from simlan.errors import SimlanError
from simlan.hosts import Cluster
from simlan.state import load, locked
from simlan.system import require

NAME = "outside"
LAST_OCTET = 250  # nodes are .10 upwards (network.FIRST_HOST), the bridge .1


def address() -> str:
    return f"10.77.{network.LAB}.{LAST_OCTET}"


@contextlib.contextmanager
def outsider(cluster: Cluster, *, programs_of: str | None = None) -> Iterator[list[str]]:
    """The argv prefix that runs a command on the outside host, for the duration of the block."""
    if cluster.stock != (programs_of is not None):
        raise SimlanError("an outside host runs a stock host's programs (programs_of=<host>) on stock hosts, "
                          "this machine's beside root hosts (no programs_of)")
    host = cluster.host(programs_of) if programs_of else None
    if host is not None and not host.alive:
        raise SimlanError(f"{programs_of} is down: the outside host runs its programs")
    ip = require()["ip"]
    with locked(cluster.state_dir):
        if network.netns_exists(network.netns_name(NAME)):
            raise SimlanError(f"network namespace {network.netns_name(NAME)} exists already (another test's "
                              f"outside host?); remove it: ip netns del {network.netns_name(NAME)}")
        _record(cluster, True)
        network.create_host_link(ip, "", NAME, address(), None)
    net = f"--net=/run/netns/{network.netns_name(NAME)}"
    try:
        yield ["nsenter", "-t", str(host.pid1), "-m", "-r", net, "--"] if host else ["nsenter", net, "--"]
    finally:
        remove(cluster)


def remove(cluster: Cluster) -> None:
    """Take the outside host off the LAN (safe when it is already gone)."""
    ip = require()["ip"]
    with locked(cluster.state_dir):
        network.delete_netns(ip, NAME)
        _record(cluster, False)


def _record(cluster: Cluster, present: bool) -> None:
    """Mark the outside host in the state on disk (a host may have been killed or revived since `cluster`
    was read: only this flag changes)."""
    current = Cluster.from_json(load(cluster.state_dir) or cluster.to_json())
    current.outsider = present
    current.save()
