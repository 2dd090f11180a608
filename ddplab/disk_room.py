"""Room on a node's disk for one transfer, checked before any byte of it is copied (the wheels, the shards,
the code and each ddplab_sync_dirs folder all travel through ddplab/sync_push.py or ddplab/relay.py).

The node folder may not exist yet, and a sync dir outside the lab folder may sit on another file system than
the lab: the node reports the free bytes (statvfs f_bavail: what an unprivileged writer may use) of the file
system holding the folder, or its nearest existing parent, and the bytes of the files the transfer replaces
(they are rewritten, so their old size comes back). need = bytes sent - bytes replaced; need > free refuses
with one message naming the node, the folder, need and free, and the fix.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess

from ddplab.errors import DdplabError
from ddplab.node_command import DEFAULT_INTERPRETER, nodeprobe_command, shipped_program
from ddplab.sync_push import expand, ssh_command, target

ROOM_VERB = "disk-room"  # nodeprobe/disk_room.py, shipped alone

def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def node_room(spec: dict, dests: list[str]) -> dict:
    """{path, free, replaced} of the node folder spec["base"] (over the node's SSH, or here when local):
    nodeprobe/disk_room.py run as spec["room"] says (roles/code_sync: the ddplab_node_argv lookup, the one
    way node code runs; without it, as ddplab/node_command.py runs a shipped verb by default)."""
    conn, base = spec["conn"], str(spec["base"])
    argv = spec.get("room") or nodeprobe_command(ROOM_VERB, [], DEFAULT_INTERPRETER)[0]
    if not conn.get("local"):
        argv = [*ssh_command(conn), target(conn, "").rstrip(":"), "--", shlex.join(argv)]
    program = shipped_program(ROOM_VERB) + json.dumps({"base": base, "dests": dests})
    proc = subprocess.run(argv, input=program, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise DdplabError(f"could not read the free space of {base} on {target(conn, '').rstrip(':')} "
                          f"({' '.join(proc.stderr.split())[-300:] or f'exit code {proc.returncode}'}); "
                          "check that the node is up and has python3")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check(spec: dict) -> dict:
    """Refuse (DdplabError) when spec's files (as sync-push takes them) do not fit on the node's file system
    under spec["base"]; else {path, free, need}."""
    files = expand(spec)
    if not files:
        return {"need": 0}
    sizes = {str(f["dest"]): os.path.getsize(f["src"]) for f in files}
    room = node_room(spec, sorted(sizes))
    need = max(0, sum(sizes.values()) - room["replaced"])
    if need > room["free"]:
        name = spec.get("name") or target(spec["conn"], "").rstrip(":")
        raise DdplabError(
            f"{name}: {spec['base']} needs {mib(need)} ({need} bytes, {len(files)} files) and its file "
            f"system ({room['path']}) has {mib(room['free'])} free ({room['free']} bytes); nothing was "
            f"copied. Free {mib(need - room['free'])} on {name}, or point the folder at a larger disk "
            "(ddplab_root, or the ddplab_sync_dirs dest)")
    return {"path": room["path"], "free": room["free"], "need": need}
