"""``python -m ddplab relay --progress FILE < SPEC``: each changed file leaves the control host once; the
nodes pass it on to each other.

The files go in batches (about BATCHES, at least BATCH_MIN_BYTES each; ``batches``). The seed (the first
node of the spec: the master) gets its batches from the control host (rsync, as the star path). A node
*holds* a batch once it received it, or from the start when it needs none of its files (what a node does
not list was hashed equal on it). Each node that still needs a batch gets it from an idle holder
(``pick``); a node receives one batch and sends one batch at a time, so a node passes batch k on while
batch k+1 is still arriving (a pipelined tree: the senders double each round, and the control host's link
carries each byte once). A node-to-node copy is rsync run *on the holder* (the control host asks it over its
usual SSH connection) into the receiver over SSH with the holder's own relay key, whose line in the
receiver's authorized_keys only lets it send files, with this hop's exact rsync options, into the
receiver's staging folder ``<lab folder>/.relay/incoming`` (nodeprobe/relay_access.py, relay_receive.py);
the receiver's host key is checked against the lab's known_hosts (roles/relay_ssh). Then the control host
runs the receiver's own step over its usual SSH connection (nodeprobe/relay_take.py, ``take``, as the node's
``take`` argv says: ddplab/node_command.py's command for ``nodeprobe relay-take``, the one way node code
runs; roles/code_sync gets it from the ddplab_node_argv lookup): each staged
file moves into place only when its sha256 is the control host's file's, and the rest of the staging folder
is deleted; only then does the receiver hold the batch (and may pass it on, from its lab folder). So a node
can give a peer nothing but the files the control host planned. ``--partial`` keeps what arrived before an
interruption in the staging folder, so the next run sends only the rest. A copy already running on a holder
finishes even when this job is killed.

A node-to-node copy that fails, or a file that arrives different, is sent from the control host instead,
and the result names it.

SPEC (JSON on stdin)::

    {"nodes": [{"name": "node0", "root": "/root/ddplab", "addr": "10.0.0.5",   # lab folder, lab address
                "conn": {...},                                # as sync_push's conn (Ansible's SSH)
                "take": ["python3", "-I", "-c", ...],         # runs nodeprobe relay-take on the node
                "room": ["python3", "-I", "-c", ...],         # nodeprobe disk-room (ddplab/disk_room.py)
                "base": "/root/ddplab/data",                  # the node folder dest is relative to
                "files": [{"src": "/ctl/data/a.bin", "dest": "a.bin"}],   # or names: sync_push.expand
                "src_dir": ""},
               ...]}

A node whose base is not inside its lab folder (a ddplab_sync_dirs dest elsewhere) gets its files from the
control host (relay_take.py places files into the lab folder only); the result names it.

FILE is rewritten as ``{"state", "elapsed", "lines": ["node1 <- node0: 40 MiB / 1.0 GiB ...", ...],
"line"}``. Prints ``{"control_bytes", "sources": {node: "control" | holder}, "fallbacks": [...], "elapsed"}``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from ddplab import disk_room, sync_push
from ddplab.errors import DdplabError
from ddplab.node_command import shipped_program
from ddplab.transfer_progress import Meter
from nodeprobe.hashing import sha256_file

CONTROL = "control"
# On every node, under its lab folder: its own relay key and the known_hosts of the lab's nodes.
RELAY_DIR = ".relay"
KEY_FILE = f"{RELAY_DIR}/id_ed25519"
KNOWN_HOSTS_FILE = f"{RELAY_DIR}/known_hosts"
# The receiver's step after a hop: a verb shipped alone (its source, then its spec, on stdin; see take).
TAKE_VERB = "relay-take"
CONNECT_TIMEOUT_S = 10
# Pipelining: the files are sent in about BATCHES batches of at least BATCH_MIN_BYTES each.
BATCHES = 8
BATCH_MIN_BYTES = 16 << 20
# Node-to-node SSH connections are shared between the batches (a socket in the holder's .relay folder,
# closed this many seconds after the last batch).
MUX_PERSIST_S = 10
# The receiver's step hashes a batch (about 1/BATCHES of the files) once.
TAKE_TIMEOUT_S = 600


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


def node_ssh(node: dict) -> list[str]:
    """ssh to ``node`` as Ansible reaches it (its options, host keys checked as for every task)."""
    argv = sync_push.ssh_command(node["conn"])
    if node["conn"].get("user"):
        argv += ["-l", str(node["conn"]["user"])]
    return argv + [str(node["conn"]["host"])]


def relay_rsh(src: dict, dst: dict) -> str:
    """The ssh the holder's rsync uses to reach the receiver: its own relay key only, the host key checked."""
    root = src["root"].rstrip("/")
    argv = ["ssh", "-i", f"{root}/{KEY_FILE}", "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={root}/{KNOWN_HOSTS_FILE}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "StrictHostKeyChecking=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
            "-o", "ControlMaster=auto", "-o", f"ControlPersist={MUX_PERSIST_S}",
            "-o", f"ControlPath={root}/{RELAY_DIR}/cm-%C",
            "-p", str(int(dst["conn"].get("port") or 22))]
    if dst["conn"].get("user"):
        argv += ["-l", str(dst["conn"]["user"])]
    return shlex.join(argv)


def hop_argv(src: dict, dst: dict) -> list[str]:
    """The control host's command: ssh to the holder, which runs rsync into the receiver's staging folder
    (its forced command writes only there, whatever the destination: ``addr:``). The files are chosen by
    filter rules on stdin (``hop_rules``), not --files-from, which would add -R: the receiver accepts
    exactly ``rsync --server -trIe.<capabilities> --partial . .`` (nodeprobe/relay_receive.py)."""
    host = f"[{dst['addr']}]" if ":" in dst["addr"] else dst["addr"]
    remote = ["rsync", "--recursive", "--times", "--ignore-times", "--partial", "--from0",
              "--include-from=-", "--exclude=*", "--info=progress2", "--no-inc-recursive",
              "--rsh", relay_rsh(src, dst), src["root"].rstrip("/") + "/", f"{host}:"]
    return node_ssh(src) + ["--", shlex.join(remote)]


def rule(path: str) -> str:
    """An rsync filter pattern that matches ``path`` (relative to the transfer's root) and nothing else."""
    if any(c in path for c in "*?["):  # a backslash escapes only in a pattern that holds a wildcard
        path = "".join("\\" + c if c in "*?[\\" else c for c in path)
    return "/" + path


def hop_rules(dests: list[str]) -> bytes:
    """The include rules (NUL-separated) of ``dests`` and of the folders on their way."""
    rules = set()
    for dest in dests:
        parts = dest.strip("/").split("/")
        rules.update(rule("/".join(parts[:i])) + "/" for i in range(1, len(parts)))
        rules.add(rule("/".join(parts)))
    return "".join(r + "\0" for r in sorted(rules)).encode()


def take_argv(dst: dict) -> list[str]:
    """The control host's command for the receiver's own step (nodeprobe/relay_take.py): the node's
    ``take`` argv over its SSH connection."""
    return node_ssh(dst) + ["--", shlex.join(dst["take"])]


def take_source() -> str:
    return shipped_program(TAKE_VERB)


def take(dst: Node, files: list[dict], keep: list[str]) -> dict:
    """Run the receiver's step: the staged ``files`` whose sha256 is the control host's go into place."""
    spec = {"root": dst.spec["root"], "keep": keep,
            "files": [{"dest": f["dest"], "sha256": dst.sha256(f)} for f in files]}
    try:
        proc = subprocess.run(take_argv(dst.spec), input=take_source() + json.dumps(spec),
                              capture_output=True, text=True, timeout=TAKE_TIMEOUT_S)
        if proc.returncode == 0:
            return json.loads(proc.stdout)
        why = " ".join(proc.stderr.split())[-400:] or f"exit code {proc.returncode}"
    except subprocess.TimeoutExpired:
        why = f"no answer within {TAKE_TIMEOUT_S} s"
    except ValueError:
        why = f"it printed {proc.stdout[-200:]!r}"
    raise DdplabError(f"placing the relayed files on {dst.name} failed: {why}")


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


def batches(nodes: list[dict]) -> list[list[str]]:
    """The dests any node needs, in name order, cut into batches of at least BATCH_MIN_BYTES (and about
    1/BATCHES of the total): a node passes a batch on while the next one is still arriving (pipelining)."""
    sizes = {f["dest"]: os.path.getsize(f["src"]) for n in nodes for f in n["files"]}
    least = max(BATCH_MIN_BYTES, sum(sizes.values()) // BATCHES)
    out, cur, cur_bytes = [], [], 0
    for dest in sorted(sizes):
        cur.append(dest)
        cur_bytes += sizes[dest]
        if cur_bytes >= least:
            out.append(cur)
            cur, cur_bytes = [], 0
    return out + ([cur] if cur else [])


def with_mux(conn: dict, folder: str) -> dict:
    """conn with its SSH connection shared between the job's transfers (ControlPath in the job's own temp
    folder; Ansible's ssh_args already ask for ControlMaster/ControlPersist, ssh takes the first value)."""
    extra = f"-o ControlMaster=auto -o ControlPersist=30 -o ControlPath={folder}/%C"
    return {**conn, "extra_args": f"{conn.get('extra_args') or ''} {extra}".strip()}


class Node:
    """One node's part of the job: what it needs per batch, the batches it holds, its progress meter."""

    def __init__(self, spec: dict, cuts: list[list[str]], sums: dict[str, str] | None = None):
        self.spec, self.name, self.sums = spec, spec["name"], {} if sums is None else sums
        self.need = {f["dest"]: f for f in spec["files"]}
        self.wants = [[self.need[d] for d in cut if d in self.need] for cut in cuts]
        self.has = {b for b, files in enumerate(self.wants) if not files}
        self.done = 0
        self.meter = Meter(sum(os.path.getsize(f["src"]) for f in spec["files"]), len(spec["files"]),
                           sorted(self.need))

    def sha256(self, f: dict) -> str:
        """The control host's file's sha256 (its stat cache makes a file hashed by the plan cost nothing)."""
        if f["src"] not in self.sums:
            self.sums[f["src"]] = sha256_file(f["src"])
        return self.sums[f["src"]]

    def missing(self) -> int | None:
        return next((b for b in range(len(self.wants)) if b not in self.has), None)


def hop(src: Node, dst: Node, b: int, board: Board) -> int:
    """The holder ``src`` rsyncs batch ``b`` into ``dst``'s staging folder, and ``dst``'s own step puts
    what matches the control host's files in place; the bytes sent."""
    files = dst.wants[b]
    rules = hop_rules([str(f["dest"]) for f in files])
    with tempfile.TemporaryFile("w+") as err:
        rc, why = sync_push.stream(hop_argv(src.spec, dst.spec), rules, err, dst.meter, board.start,
                                   dst.done, lambda state: board.update(dst.name, src.name, state))
    if rc != 0:
        raise DdplabError(f"relay {src.name} -> {dst.name} failed: {why}")
    later = [str(f["dest"]) for files_later in dst.wants[b + 1:] for f in files_later]
    out = take(dst, files, later)
    if out["refused"]:
        shown = "; ".join(f"{r['dest']}: {r['why']}" for r in out["refused"][:3])
        raise DdplabError(f"relay {src.name} -> {dst.name}: {len(out['refused'])} file(s) not placed "
                          f"({shown})")
    return sum(os.path.getsize(f["src"]) for f in files)


def from_control(dst: Node, files: list[dict], board: Board) -> int:
    """The control host sends ``files`` to ``dst`` (sync_push, as the star path); the bytes sent."""
    offset = dst.done

    def seen(state: dict) -> None:
        dst.meter.add(time.monotonic() - board.start, offset + state["done"])
        board.update(dst.name, CONTROL, dst.meter.state(time.monotonic() - board.start))

    sync_push.push({"base": dst.spec["base"], "files": files, "conn": dst.spec["conn"]}, seen)
    return sum(os.path.getsize(f["src"]) for f in files)


def relay(spec: dict, progress: str) -> dict:
    board = Board(progress, time.monotonic())
    result = {"control_bytes": 0, "sources": {}, "fallbacks": []}
    inside = [under_root(n) for n in spec["nodes"]]
    for node, mapped in zip(spec["nodes"], inside, strict=True):
        if node["files"] and mapped is None:
            outside = Node({**node, "files": sync_push.expand(node)}, [])
            result["control_bytes"] += from_control(outside, outside.spec["files"], board)
            result["sources"][node["name"]] = [CONTROL]
            result["fallbacks"].append(f"{node['base']} on {node['name']} is outside its lab folder "
                                       f"{node['root']}, where relayed files are not placed; sent from the "
                                       "control host")
    inside = [m for m in inside if m is not None]
    if any(n["files"] for n in inside):
        run_tree(inside, board, result)
    board.write("done")
    result["elapsed"] = round(time.monotonic() - board.start, 1)
    return result


def pick(dst: Node, nodes: dict[str, Node], seed: str, sending: set[str]) -> str | None:
    """Who sends ``dst`` its next batch: an idle node that holds it, else the control host (to the seed
    only, so the uplink carries each byte once); None: wait."""
    b = dst.missing()
    idle = [n for n in nodes.values() if n.name not in sending and n.name != dst.name]
    holder = next((n.name for n in idle if b in n.has), None)
    if holder is not None:
        return holder
    return CONTROL if dst.name == seed and CONTROL not in sending else None


def run_tree(inside: list[dict], board: Board, result: dict) -> None:
    """Every node gets its batches from an idle holder (first the seed, from the control host), one
    incoming and one outgoing transfer per node at a time: a pipelined tree."""
    cuts = batches(inside)
    seed = inside[0]["name"]
    with tempfile.TemporaryDirectory(prefix="ddplab-relay-") as mux:
        sums: dict[str, str] = {}  # each control-side file hashed once, for every receiver
        nodes = {n["name"]: Node({**n, "conn": with_mux(n["conn"], mux)}, cuts, sums) for n in inside}
        sending, receiving, running = set(), set(), {}
        with ThreadPoolExecutor(max_workers=2 * len(nodes) + 1) as pool:
            while any(n.missing() is not None for n in nodes.values()) or running:
                for dst in nodes.values():
                    if dst.name in receiving or dst.missing() is None:
                        continue
                    src = pick(dst, nodes, seed, sending)
                    if src is None:
                        continue
                    b, files = dst.missing(), dst.wants[dst.missing()]
                    job = (pool.submit(from_control, dst, files, board) if src == CONTROL
                           else pool.submit(hop, nodes[src], dst, b, board))
                    running[job] = (src, dst.name, b)
                    sending.add(src)
                    receiving.add(dst.name)
                if not running:
                    raise DdplabError("relay: no node holds the files and the seed receives none")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for job in finished:
                    src, name, b = running.pop(job)
                    dst = nodes[name]
                    try:
                        sent = job.result()
                    except DdplabError as e:
                        if src == CONTROL:
                            board.write("failed")
                            raise
                        # The receiver still gets the batch: from the control host, as the star path would.
                        result["fallbacks"].append(f"{e}; sent {name} those files from the control host "
                                                   "instead")
                        sent, src = from_control(dst, dst.wants[b], board), CONTROL
                    if src == CONTROL:
                        result["control_bytes"] += sent
                    sending.discard(src)
                    receiving.discard(name)
                    dst.has.add(b)
                    dst.done += sent
                    result["sources"].setdefault(name, [])
                    if src not in result["sources"][name]:
                        result["sources"][name].append(src)
                    if dst.missing() is None:
                        dst.meter.add(time.monotonic() - board.start, dst.meter.total)
                        board.update(name, src, dst.meter.state(time.monotonic() - board.start, "done"), True)


def add_parser(sub):
    p = sub.add_parser("relay", help="send changed files once to the seed node; the nodes pass them on")
    p.add_argument("--progress", required=True, help="JSON file rewritten with every node's progress")
    p.set_defaults(func=cmd_relay)


def cmd_relay(args):
    try:
        spec = json.loads(sys.stdin.read())
        if not spec.get("nodes") or not all({"name", "root", "addr", "conn", "take", "files"} <= set(n)
                                            for n in spec["nodes"]):
            raise ValueError("expected nodes, each with name, root, addr, conn, take and files")
    except (ValueError, AttributeError, TypeError) as e:
        raise DdplabError(f"relay: the spec on stdin is not usable ({e}); see python -m ddplab relay "
                          "--help") from None
    for node in spec["nodes"]:  # before any byte travels: room on every node's file system under its base
        disk_room.check(node)
    print(json.dumps(relay(spec, args.progress)))
    return 0
