"""``python -m ddplab relay --progress FILE < SPEC``: each changed file leaves the control host once; the
nodes pass it on to each other.

The seed (the first node of the spec: the master) gets its missing files from the control host
(``sync_push.push``, as the star path). Every node that already holds every file of the plan (nothing to
receive), and every node once its own transfer ended, is a *holder*: it holds the whole plan, proven by
sha256 before (what a node does not list was hashed equal) or after (the role hashes again). Each node
that still needs files gets them from the first idle holder, so the number of nodes that can send doubles
with each round (a binomial tree: 8 nodes in 1 + 3 rounds). A node-to-node copy is rsync run *on the
holder* (the control host asks it over its usual SSH connection) into the receiver over SSH with the lab's
relay key, whose authorized_keys entry only lets it rsync into the lab folder (nodeprobe/relay_access.py);
the receiver's host key is checked against the lab's known_hosts (roles/relay_ssh). ``--partial`` keeps
what arrived before an interruption, so the next run sends only the rest.

A node-to-node copy that fails is sent from the control host instead, and the result names it.

SPEC (JSON on stdin)::

    {"nodes": [{"name": "node0", "root": "/root/ddplab", "addr": "10.0.0.5",   # lab folder, lab address
                "conn": {...},                                # as sync_push's conn (Ansible's SSH)
                "base": "/root/ddplab/data",                  # the node folder dest is relative to
                "files": [{"src": "/ctl/data/a.bin", "dest": "a.bin"}],   # or names: sync_push.expand
                "src_dir": ""},
               ...]}

A node whose base is not inside its lab folder (a ddplab_sync_dirs dest elsewhere) gets its files from the
control host (the relay key may only write into the lab folder); the result names it.

FILE is rewritten as ``{"state", "elapsed", "lines": ["node1 <- node0: 40 MiB / 1.0 GiB ...", ...],
"line"}``. Prints ``{"control_bytes", "sources": {node: "control" | holder}, "fallbacks": [...], "elapsed"}``.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from ddplab import sync_push
from ddplab.errors import DdplabError
from ddplab.transfer_progress import Meter

CONTROL = "control"
# On every node, under its lab folder: the lab's relay key and the known_hosts of the lab's nodes.
RELAY_DIR = ".relay"
KEY_FILE = f"{RELAY_DIR}/id_ed25519"
KNOWN_HOSTS_FILE = f"{RELAY_DIR}/known_hosts"
CONNECT_TIMEOUT_S = 10


def under_root(node: dict) -> dict | None:
    """``node`` with each dest relative to its lab folder, or None when base is outside it."""
    node = {**node, "files": sync_push.expand(node)}
    root, base = os.path.normpath(node["root"]), os.path.normpath(node.get("base") or node["root"])
    if os.path.commonpath([root, base]) != root:
        return None
    sub = os.path.relpath(base, root)
    files = [{"src": f["src"], "dest": os.path.normpath(os.path.join(sub, str(f["dest"]).lstrip("/")))}
             for f in node["files"]]
    return {**node, "base": root, "files": files}


def order(nodes: list[dict]) -> tuple[list[str], list[str]]:
    """(holders at the start, receivers in the order they are served): the seed first when it receives."""
    seed = nodes[0]["name"]
    holders = [n["name"] for n in nodes if not n["files"] and n["name"] != seed]
    receivers = [n["name"] for n in nodes if n["files"] and n["name"] != seed]
    if not nodes[0]["files"]:
        holders.insert(0, seed)
    return holders, receivers


def plan_rounds(nodes: list[dict]) -> list[list[tuple[str, str]]]:
    """The transfers as rounds of equal-length copies ((source, receiver); CONTROL for the control host):
    what ``relay`` does when every copy takes the same time. For tests and the docs."""
    holders, receivers = order(nodes)
    rounds = [[(CONTROL, nodes[0]["name"])]] if nodes[0]["files"] else []
    fresh = [nodes[0]["name"]] if nodes[0]["files"] else []
    while receivers:
        holders = holders + fresh
        if not holders:
            raise DdplabError("relay: no node holds the files and the seed receives none")
        pairs = list(zip(holders, receivers, strict=False))
        receivers = receivers[len(pairs):]
        fresh = [dst for _, dst in pairs]
        rounds.append(pairs)
    return rounds


def node_ssh(node: dict) -> list[str]:
    """ssh to ``node`` as Ansible reaches it (its options, host keys checked as for every task)."""
    argv = sync_push.ssh_command(node["conn"])
    if node["conn"].get("user"):
        argv += ["-l", str(node["conn"]["user"])]
    return argv + [str(node["conn"]["host"])]


def relay_rsh(src: dict, dst: dict) -> str:
    """The ssh the holder's rsync uses to reach the receiver: the lab key only, its host key checked."""
    root = src["root"].rstrip("/")
    argv = ["ssh", "-i", f"{root}/{KEY_FILE}", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={root}/{KNOWN_HOSTS_FILE}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-p", str(int(dst["conn"].get("port") or 22))]
    if dst["conn"].get("user"):
        argv += ["-l", str(dst["conn"]["user"])]
    return shlex.join(argv)


def hop_argv(src: dict, dst: dict) -> list[str]:
    """The control host's command: ssh to the holder, which runs rsync into the receiver's lab folder (the
    receiver's forced command, rrsync, roots every path there: ``addr:`` is the lab folder)."""
    host = f"[{dst['addr']}]" if ":" in dst["addr"] else dst["addr"]
    remote = ["rsync", "--recursive", "--times", "--ignore-times", "--partial", "--from0",
              "--files-from=-", "--info=progress2", "--no-inc-recursive", "--rsh", relay_rsh(src, dst),
              src["root"].rstrip("/") + "/", f"{host}:"]
    return node_ssh(src) + ["--", shlex.join(remote)]


class Board:
    """Every transfer's Meter, written to the progress file at most every sync_push.WRITE_EVERY_S."""

    def __init__(self, path: str, start: float):
        self.path, self.start, self.lock, self.last = path, start, threading.Lock(), 0.0
        self.rows: dict[str, tuple[str, dict]] = {}

    def update(self, name: str, source: str, state: dict, force: bool = False) -> None:
        with self.lock:
            self.rows[name] = (source, state)
            if force or time.monotonic() - self.last >= sync_push.WRITE_EVERY_S:
                self.write("running")

    def write(self, status: str) -> None:
        lines = [f"{name} <- {src}: {state['line']}" for name, (src, state) in sorted(self.rows.items())]
        sync_push.write_state(self.path, {"state": status, "elapsed": round(time.monotonic() - self.start, 1),
                                          "lines": lines, "line": " | ".join(lines)})


def hop(src: dict, dst: dict, board: Board) -> None:
    files = dst["files"]
    meter = Meter(sum(os.path.getsize(f["src"]) for f in files), len(files), [f["dest"] for f in files])
    listing = "".join(str(f["dest"]).lstrip("/") + "\0" for f in files).encode()
    with tempfile.TemporaryFile("w+") as err:
        rc, why = sync_push.stream(hop_argv(src, dst), listing, err, meter, board.start, 0,
                                   lambda state: board.update(dst["name"], src["name"], state))
    if rc != 0:
        board.update(dst["name"], src["name"], {**meter.state(0, "failed"), "line": f"failed: {why}"}, True)
        raise DdplabError(f"relay {src['name']} -> {dst['name']} failed: {why}")
    meter.add(time.monotonic() - board.start, meter.total)
    board.update(dst["name"], src["name"], meter.state(time.monotonic() - board.start, "done"), True)


def from_control(dst: dict, board: Board) -> int:
    spec = {"base": dst["base"], "files": dst["files"], "src_dir": dst.get("src_dir"), "conn": dst["conn"]}
    sync_push.push(spec, lambda state: board.update(dst["name"], CONTROL, state, state["state"] != "running"))
    return sum(os.path.getsize(f["src"]) for f in sync_push.expand(dst))


def relay(spec: dict, progress: str) -> dict:
    board = Board(progress, time.monotonic())
    result = {"control_bytes": 0, "sources": {}, "fallbacks": []}
    outside = [n for n in spec["nodes"] if n["files"] and under_root(n) is None]
    for node in outside:
        result["control_bytes"] += from_control(node, board)
        result["sources"][node["name"]] = CONTROL
        result["fallbacks"].append(f"{node['base']} on {node['name']} is outside its lab folder "
                                   f"{node['root']}, where the relay key may not write; sent from the "
                                   "control host")
    inside = [under_root(n) for n in spec["nodes"] if n not in outside]
    if inside:
        run_tree(inside, board, result)
    board.write("done")
    result["elapsed"] = round(time.monotonic() - board.start, 1)
    return result


def run_tree(inside: list[dict], board: Board, result: dict) -> None:
    """The binomial tree over ``inside`` (dests relative to each lab folder), the first node the seed."""
    nodes = {n["name"]: n for n in inside}
    seed = inside[0]
    holders, receivers = order(inside)
    with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
        running = {}
        if seed["files"]:
            running[pool.submit(from_control, seed, board)] = (CONTROL, seed["name"])
        while receivers or running:
            while holders and receivers:
                src, dst = holders.pop(0), receivers.pop(0)
                running[pool.submit(hop, nodes[src], nodes[dst], board)] = (src, dst)
            if not running:
                raise DdplabError("relay: no node holds the files and the seed receives none")
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                src, dst = running.pop(fut)
                try:
                    sent = fut.result()
                except DdplabError as e:
                    if src == CONTROL:
                        board.write("failed")
                        raise
                    # The receiver still gets its files: from the control host, as the star path would.
                    result["fallbacks"].append(f"{e}; sent {dst} its files from the control host instead")
                    holders.append(src)
                    sent, src = from_control(nodes[dst], board), CONTROL
                if src == CONTROL:
                    result["control_bytes"] += sent
                else:
                    holders.append(src)
                result["sources"][dst] = src
                holders.append(dst)


def add_parser(sub):
    p = sub.add_parser("relay", help="send changed files once to the seed node; the nodes pass them on")
    p.add_argument("--progress", required=True, help="JSON file rewritten with every node's progress")
    p.set_defaults(func=cmd_relay)


def cmd_relay(args):
    try:
        spec = json.loads(sys.stdin.read())
        if not spec.get("nodes") or not all({"name", "root", "addr", "conn", "files"} <= set(n)
                                            for n in spec["nodes"]):
            raise ValueError("expected nodes, each with name, root, addr, conn and files")
    except (ValueError, AttributeError, TypeError) as e:
        raise DdplabError(f"relay: the spec on stdin is not usable ({e}); see python -m ddplab relay "
                          "--help") from None
    print(json.dumps(relay(spec, args.progress)))
    return 0
