"""``ready``: did this node pass launch.yml's checks with these inputs, and is it still as it was then?

launch.yml's checks (roles/preflight) pass, then the node's record of them is written (``write``): the
control host's input fingerprint (``inputs``: every setting the checks or prepare read, the inventory, the
control host's code, shards and ddplab_sync_dirs; ddplab/plan.py) and this node's own state (``state``).
A relaunch asks every node first (roles/plan): a node is ready when its record names the same inputs,
its state is still the recorded one, no rank of the lab runs and (the master) the master port is free.
When every node is ready, the launch neither checks nor prepares them again; any other answer (no record,
another fingerprint, a lab folder wiped, a file of the code or a shard changed on the node, a rank still
running, a port taken, no answer) leaves the launch as it was: check every node, prepare where a check fails.

The node's state: the files ddplab placed in the code folder (their hashes), the shards of the data folder,
each ddplab_sync_dirs folder, the Python the lab's record names (which must still be there) and the
firewall's state as preflight's firewall check reads it (a firewall turned off since is checked again).
Hashing uses the stat cache (nodeprobe.hashing): a relaunch re-reads nothing that did not change.

Spec on stdin: ``{"root": LAB (a leading ~ is the home), "inputs": HEX, "sync_dirs": [dest, ...],
"master": true on the master (its port must be free), "master_port": N, "shared": false, "write": false}``.
Prints ``{"probe": "ready", "ready": bool, "why": "...", "home": ...}`` (``write``: ``{"probe": "ready",
"written": PATH}``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from nodeprobe import hashing
from nodeprobe.preflight_node import flag
from nodeprobe.spec import read_spec

# In the lab folder: the record of the last launch whose checks this node passed.
RECORD = "checks-passed.json"


def state(root: Path, sync_dirs: list[str]) -> dict:
    """What the checks saw on this node that can change without the control host's inputs changing."""
    from nodeprobe import net

    code = root / "code"
    lines = hashing.tree_lines(code, hashing.tree_files(code, placed_only=True)) if code.is_dir() else []
    data = hashing.shard_set(root / "data")
    python_file = root / "python"
    try:
        python = python_file.read_text().strip()
    except OSError:
        python = ""
    out = {
        "code": hashing.lines_digest(lines),
        "data": [data.get("digest"), data.get("manifest_digest")],
        "sync": {str(d): hashing.tree_hash(root / str(d)).get("sha256") for d in sync_dirs},
        "python": python,
        # ufw or firewalld turned off (or its default policy opened) since: the firewall check runs again
        "firewall": net.firewall(),
    }
    hashing.flush_cache()
    return out


def digest(node_state: dict) -> str:
    return hashlib.sha256(json.dumps(node_state, sort_keys=True).encode()).hexdigest()


def not_ready(root: Path, spec: dict) -> str:
    """Why this node must be checked again ("" when it need not)."""
    from nodeprobe import procs

    try:
        record = json.loads((root / RECORD).read_text())
    except (OSError, ValueError):
        return f"no record of passed checks in {root}"
    if not isinstance(record, dict) or record.get("inputs") != spec.get("inputs"):
        return "the inputs changed since its checks passed (settings, inventory, code, shards or torch pin)"
    if record.get("state") != digest(state(root, spec.get("sync_dirs") or [])):
        return "its code, shards, sync folders, Python or firewall changed since its checks passed"
    if not os.access(record.get("python") or "", os.X_OK):
        return "the lab's Python is gone"
    # as preflight's stale_processes check: a rank or launcher counts, the lab's tmux server does not
    if procs.lab_processes(str(root), shared=flag(spec.get("shared")))["ranks"]:
        return "a rank of the lab runs"
    port = spec.get("master_port")
    if flag(spec.get("master")) and not procs.port_holder(int(port))["free"]:
        return f"the master port {port} is taken"
    return ""


def write(root: Path, spec: dict) -> dict:
    node_state = state(root, spec.get("sync_dirs") or [])
    path = root / RECORD
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"inputs": spec["inputs"], "state": digest(node_state),
                               "python": node_state["python"]}) + "\n")
    os.replace(tmp, path)
    return {"probe": "ready", "written": str(path)}


def run(text: str) -> dict:
    spec = read_spec(text, needs=("root", "inputs"))
    root = Path(os.path.expanduser(str(spec["root"]))).resolve()
    if spec.get("write"):
        return write(root, spec)
    why = not_ready(root, spec)
    return {"probe": "ready", "ready": not why, "why": why, "home": os.path.expanduser("~")}
