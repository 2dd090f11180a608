"""``python -m ddplab distribution < SPEC``: star or relay for this prepare, and why (ddplab_distribution).

star: the control host sends every node its files (sync_push). relay: it sends them once, to the seed,
and the nodes pass them on (ddplab/relay.py), which needs node-to-node SSH limited to rsync into the lab
folder (roles/relay_ssh). ``auto`` takes relay from RELAY_FROM_NODES nodes on: with 2 nodes a relay saves
one copy and costs a node-to-node hop after it (bench/distribution.py measures both).

SPEC::

    {"setting": "auto" | "star" | "relay",
     "nodes": [{"name": "node0", "local": false, "root": "/root/ddplab",
                # after roles/relay_ssh probed the node (absent before):
                "addr": "10.0.0.5", "pubkey": "ssh-ed25519 AAAA...", "rsync": "/usr/bin/rsync",
                "host_keys": ["10.0.0.5 ssh-ed25519 AAAA..."]}]}

Prints ``{"mode": "star" | "relay", "why": "...", "known_hosts": "...", "peers": [...]}``: ``why`` is one
line for the operator (also when the setting asked for relay and it is not possible); for relay,
``known_hosts`` the lab's known_hosts for the node-to-node hops, assembled here from the host key each node
read from its own SSH server, and ``peers`` each node's ``{"name", "from", "pubkey"}``: the IP addresses its
hops come from (a host name is resolved here, on the control host: sshd's from= compares addresses) and its
own relay key's public half, what every other node's authorized_keys line holds.
"""

from __future__ import annotations

import ipaddress
import json
import re
import socket
import sys

from ddplab.errors import DdplabError

RELAY_FROM_NODES = 3
SETTINGS = ("auto", "star", "relay")
UNSAFE_PATH = set('"\\\n\r, ')


def obstacle(nodes: list[dict]) -> str:
    """Why node-to-node SSH is not possible for these nodes ("" when it is)."""
    for n in nodes:
        if n.get("local"):
            return (f"{n['name']} is reached with ansible_connection=local, so no node can reach it over SSH "
                    "with a relay key")
        if UNSAFE_PATH & set(n["root"]):
            return (f"{n['name']}'s lab folder {n['root']!r} holds a space, comma, quote or backslash, which "
                    "an authorized_keys forced command cannot hold safely")
        if "rsync" in n and not n["rsync"]:
            return f"{n['name']} has no rsync (playbooks/prepare.yml installs it)"
        if "host_keys" in n and not own_host_keys(n):
            return (f"{n['name']}'s SSH server did not give its host key to ssh-keyscan on the node itself, "
                    "so the other nodes could not check it")
    return ""


def addresses(name: str, addr: str) -> list[str]:
    """``addr`` as IP addresses: itself when it is one, else what it resolves to on the control host."""
    try:
        return [str(ipaddress.ip_address(addr))]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(addr, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError) as e:
        raise DdplabError(f"{name}: its lab address {addr!r} is not an IP address and does not resolve on "
                          f"the control host ({e}); the relay's authorized_keys lines need addresses: set "
                          f"ddplab_addr (or ansible_host) of {name} to its IP address") from None
    return sorted({str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in found})


def peers(nodes: list[dict]) -> list[dict]:
    """Every probed node's name, the addresses its hops come from and its relay key's public half."""
    return [{"name": n["name"], "from": addresses(n["name"], str(n["addr"])), "pubkey": n.get("pubkey", "")}
            for n in nodes if "addr" in n]


def own_host_keys(node: dict) -> list[str]:
    """The node's ssh-keyscan lines that name its own lab address (``addr keytype key`` or, on another port,
    ``[addr]:port keytype key``): a node vouches for its own host key, not a peer's (nor a wildcard or a
    ``@cert-authority`` line)."""
    addr = str(node.get("addr", ""))
    own = re.compile(re.escape(addr) + "|" + re.escape(f"[{addr}]") + r":\d+")
    return [" ".join(words) for words in (line.split() for line in node.get("host_keys", []))
            if len(words) == 3 and own.fullmatch(words[0])]


def decide(setting: str, nodes: list[dict]) -> dict:
    if setting not in SETTINGS:
        raise DdplabError(f"ddplab_distribution is {setting!r}; use one of {', '.join(SETTINGS)}")
    if setting == "star":
        return {"mode": "star", "why": "ddplab_distribution is star: the control host sends each node its "
                                       "files"}
    if setting == "auto" and len(nodes) < RELAY_FROM_NODES:
        return {"mode": "star", "why": f"{len(nodes)} node(s): the control host sends each its files (auto "
                                       f"relays from {RELAY_FROM_NODES} nodes on)"}
    why = obstacle(nodes)
    if why:
        return {"mode": "star", "why": f"ddplab: warning: no relay ({why}); the control host sends each node "
                                       "its files (star)"}
    keys = sorted({line for n in nodes for line in own_host_keys(n)})
    return {"mode": "relay", "why": f"relay: each changed file leaves the control host once, to "
                                    f"{nodes[0]['name']}; the {len(nodes)} nodes pass it on",
            "known_hosts": "".join(line + "\n" for line in keys), "peers": peers(nodes)}


def add_parser(sub):
    p = sub.add_parser("distribution", help="star or relay for this prepare, and why (JSON spec on stdin)")
    p.set_defaults(func=cmd_distribution)


def cmd_distribution(args):
    try:
        spec = json.loads(sys.stdin.read())
        nodes = [dict(n) for n in spec["nodes"]]
        if not nodes or not all("name" in n and "root" in n for n in nodes):
            raise ValueError("expected nodes, each with name and root")
    except (ValueError, KeyError, TypeError) as e:
        raise DdplabError(f"distribution: the spec on stdin is not usable ({e})") from None
    print(json.dumps(decide(str(spec.get("setting", "auto")), nodes)))
    return 0
