"""Checks of the inventory's shape: the node groups, ranks and the addresses peers use.

The rules kept from roles/inventory_check: a ddplab_nodes group, exactly one master, ranks 0..N-1
unique with the master at 0, addresses peers can reach (no loopback, no duplicates) unless every node
is this machine (ansible_connection: local). Added (issue 12): a missing group is an error, addresses
are IPv4 literals or names resolving to one IPv4 address here (no `any`, no CIDR). A --limit is fine
here (prepare and preflight work on part of the lab); launch.yml and start.yml refuse one that leaves
out nodes of the run in ddplab/plan.py.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from concurrent.futures import ThreadPoolExecutor, wait

from ddplab.settings.problems import Problem

NODES, MASTER, WORKERS = "ddplab_nodes", "ddplab_master", "ddplab_workers"
RESOLVE_TIMEOUT_S = 3.0
SEE = "see inventory/example/hosts.yml"


def groups(inv: dict) -> list[Problem]:
    g = inv.get("groups", {})
    nodes = g.get(NODES) or []
    masters = g.get(MASTER) or []
    if not nodes:
        found = "missing" if NODES not in g else "empty"
        return [Problem(f"group {NODES}", f"{found} in the inventory",
                        f"a group {NODES} with children {MASTER} (one host) and {WORKERS}",
                        f"pass your inventory with -i inventory/<name>; {SEE}", hosts=[])]
    if len(masters) != 1:
        return [Problem(f"group {MASTER}", f"{len(masters)} hosts {json.dumps(masters)}",
                        "exactly one host (rank 0)",
                        f"put one host in {MASTER}, the others in {WORKERS}; {SEE}",
                        hosts=[])]
    return []


def ranks(nodes: list[str], master: str, rank_of: dict) -> list[Problem]:
    """rank_of: host -> typed rank or None (missing or not an integer: already reported by its type)."""
    missing = [h for h in nodes if rank_of.get(h) is None]
    if missing:
        return [Problem("ddplab_node_rank", "missing or not an integer", f"0..{len(nodes) - 1}, unique",
                        "set ddplab_node_rank on each host in the inventory", hosts=missing)]
    layout = {h: rank_of[h] for h in nodes}
    if sorted(layout.values()) != list(range(len(nodes))) or layout[master] != 0:
        return [Problem("ddplab_node_rank", json.dumps(layout),
                        f"0..{len(nodes) - 1}, each once, with the master ({master}) at 0",
                        "set ddplab_node_rank on each host in the inventory", hosts=[])]
    return []


def _resolve(name: str) -> set[str]:
    return {ai[4][0] for ai in socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)}


def addresses(hosts: dict) -> list[Problem]:
    """hosts: name -> {addr (effective: ddplab_addr, else ansible_host, else the name), connection}."""
    all_local = all(h["connection"] == "local" for h in hosts.values())
    fix = "set ddplab_addr (or ansible_host) to the node's LAN IPv4 address"
    allowed = "an IPv4 address (or a name resolving to one) the other nodes can reach"
    out, resolved, names = [], {}, {}
    for host, h in hosts.items():
        addr = str(h["addr"]).strip()
        if "/" in addr or addr.lower() in ("any", "all", "*", ""):
            out.append(Problem("ddplab_addr", json.dumps(addr), allowed + " (no CIDR, no 'any')", fix,
                               hosts=[host]))
            continue
        try:
            ip = ipaddress.ip_address(addr)
        except ValueError:
            names[host] = addr
            continue
        if ip.version != 4:
            out.append(Problem("ddplab_addr", json.dumps(addr) + " (IPv6)", allowed, fix, hosts=[host]))
        else:
            resolved[host] = str(ip)
    if names:
        pool = ThreadPoolExecutor(max_workers=len(names))
        futures = {host: pool.submit(_resolve, name) for host, name in names.items()}
        wait(futures.values(), timeout=RESOLVE_TIMEOUT_S)
        pool.shutdown(wait=False)  # a lookup still hanging must not hold the verdict
        for host, fut in futures.items():
            name = names[host]
            if not fut.done():
                out.append(Problem("ddplab_addr", f"{json.dumps(name)} did not resolve within "
                                   f"{RESOLVE_TIMEOUT_S:.0f} s", allowed, fix, hosts=[host]))
            elif fut.exception() is not None:
                out.append(Problem("ddplab_addr", f"{json.dumps(name)} does not resolve on this control "
                                   f"host ({fut.exception()})", allowed, fix, hosts=[host]))
            elif len(fut.result()) != 1:
                out.append(Problem("ddplab_addr", f"{json.dumps(name)} resolves to "
                                   f"{', '.join(sorted(fut.result()))}", allowed + " (exactly one)",
                                   fix, hosts=[host]))
            else:
                resolved[host] = next(iter(fut.result()))
    if all_local:
        return out
    for host, ip in resolved.items():
        a = ipaddress.ip_address(ip)
        if a.is_loopback or a.is_unspecified or a.is_multicast:
            shown_addr = json.dumps(hosts[host]["addr"])
            out.append(Problem("ddplab_addr", f"{shown_addr} ({ip}) is not reachable from other machines",
                               allowed + " (loopback only when every node is this machine)",
                               fix, hosts=[host]))
    by_ip: dict[str, list[str]] = {}
    for host, ip in resolved.items():
        by_ip.setdefault(ip, []).append(host)
    for ip, same in by_ip.items():
        if len(same) > 1 and not ipaddress.ip_address(ip).is_loopback:
            out.append(Problem("ddplab_addr", f"{ip} is used by {len(same)} nodes", "one address per node",
                               fix, hosts=same))
    return out
