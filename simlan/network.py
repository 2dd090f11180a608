"""The simulated LAN: a bridge in the root namespace and one network namespace per host, joined
by a veth pair (`veth-<host>` on the bridge, `eth0` inside the host), optionally shaped with tc tbf."""

from __future__ import annotations

import os
from pathlib import Path

from simlan.errors import SimlanError
from simlan.system import run

# SIMLAN_LAB=k (0-99) runs a separate cluster beside the default one: bridge lab<k>, subnet
# 10.77.<k>.0/24, namespaces l<k>-node<i>. Lab 0 keeps the plain names (node<i>, 10.77.0.x).
LAB = int(os.environ.get("SIMLAN_LAB", "0") or 0)
if not 0 <= LAB <= 99:
    raise SystemExit(f"simlan: error: SIMLAN_LAB must be 0-99, got {LAB}")
BRIDGE = f"lab{LAB}"
GATEWAY = f"10.77.{LAB}.1"
PREFIX_LEN = 24
FIRST_HOST = 10  # node<i> gets 10.77.<lab>.(10 + i)
MAX_HOSTS = 100


def host_name(i: int) -> str:
    return f"node{i}"


def host_addr(i: int) -> str:
    return f"10.77.{LAB}.{FIRST_HOST + i}"


def netns_name(host: str) -> str:
    return host if LAB == 0 else f"l{LAB}-{host}"


def veth_name(host: str) -> str:
    # at most 15 characters for node0..node99
    return f"veth-{host}" if LAB == 0 else f"v{LAB}-{host}"


def link_exists(ip: str, name: str) -> bool:
    return run([ip, "link", "show", "dev", name], check=False).returncode == 0


def netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def check_free(ip: str, hosts: list[str]) -> None:
    """Refuse to touch a bridge, namespace or link that simlan did not record (not ours)."""
    taken = []
    if link_exists(ip, BRIDGE):
        taken.append(f"link {BRIDGE} (remove: ip link del {BRIDGE})")
    for h in hosts:
        if netns_exists(netns_name(h)):
            taken.append(f"network namespace {netns_name(h)} (remove: ip netns del {netns_name(h)})")
        if link_exists(ip, veth_name(h)):
            taken.append(f"link {veth_name(h)} (remove: ip link del {veth_name(h)})")
    if taken:
        raise SimlanError(
            "these exist but no simlan cluster is recorded, so simlan will not touch them: "
            + "; ".join(taken), code=2)


def create_bridge(ip: str) -> None:
    run([ip, "link", "add", BRIDGE, "type", "bridge"])
    run([ip, "addr", "add", f"{GATEWAY}/{PREFIX_LEN}", "dev", BRIDGE])
    run([ip, "link", "set", BRIDGE, "up"])


def create_host_link(ip: str, tc: str, host: str, addr: str, rate: str | None) -> None:
    veth, ns = veth_name(host), netns_name(host)
    run([ip, "netns", "add", ns])
    run([ip, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns])
    run([ip, "link", "set", veth, "master", BRIDGE, "up"])
    run([ip, "-n", ns, "link", "set", "lo", "up"])
    run([ip, "-n", ns, "addr", "add", f"{addr}/{PREFIX_LEN}", "dev", "eth0"])
    run([ip, "-n", ns, "link", "set", "eth0", "up"])
    if rate:
        shape(ip, tc, host, rate)


def shape(ip: str, tc: str, host: str, rate: str) -> None:
    """Limit the host's outgoing traffic on eth0 to `rate` (tc syntax: 1gbit, 100mbit, ...)."""
    proc = run([ip, "netns", "exec", netns_name(host), tc, "qdisc", "replace", "dev", "eth0", "root", "tbf",
                "rate", rate, "burst", "256kb", "latency", "10ms"], check=False)
    if proc.returncode != 0:
        why = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
        raise SimlanError(
            f"{host}: tc refused rate {rate!r} ({why}); "
            "use tc's syntax, e.g. --rate 1gbit or --rate 100mbit", code=2)


def set_link(ip: str, host: str, up: bool) -> None:
    """Bring the host's cable (its bridge port) up or down, as seen from the rest of the LAN."""
    run([ip, "link", "set", veth_name(host), "up" if up else "down"], check=False)


def delete_netns(ip: str, host: str) -> None:
    ns = netns_name(host)
    if netns_exists(ns):
        run([ip, "netns", "del", ns], what=f"ip netns del {ns}")
    if link_exists(ip, veth_name(host)):  # normally gone with the namespace
        run([ip, "link", "del", veth_name(host)], check=False)


def delete_bridge(ip: str) -> None:
    if link_exists(ip, BRIDGE):
        run([ip, "link", "del", BRIDGE], what=f"ip link del {BRIDGE}")
