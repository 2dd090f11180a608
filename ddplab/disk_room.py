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
import subprocess

from ddplab.errors import DdplabError
from ddplab.sync_push import expand, ssh_command, target

# Run on the node as `python3 -I -` with {"base", "dests"} filled in: one round trip, nothing copied there.
PROBE = """
import json, os, stat
spec = json.loads(SPEC)
path = os.path.abspath(os.path.expanduser(spec["base"]))
while not os.path.isdir(path):
    path = os.path.dirname(path)
st = os.statvfs(path)
replaced = 0
for rel in spec["dests"]:
    try:
        s = os.lstat(os.path.join(spec["base"], rel))
    except OSError:
        continue
    if stat.S_ISREG(s.st_mode):
        replaced += s.st_size
print(json.dumps({"path": path, "free": st.f_bavail * st.f_frsize, "replaced": replaced}))
"""


def mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def node_room(conn: dict, base: str, dests: list[str]) -> dict:
    """{path, free, replaced} of the node folder `base` (over the node's SSH, or here when local)."""
    program = f"SPEC = {json.dumps(json.dumps({'base': base, 'dests': dests}))}\n{PROBE}"
    argv = ["python3", "-I", "-"]
    if not conn.get("local"):
        argv = [*ssh_command(conn), target(conn, "").rstrip(":"), "python3 -I -"]
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
    room = node_room(spec["conn"], str(spec["base"]), sorted(sizes))
    need = max(0, sum(sizes.values()) - room["replaced"])
    if need > room["free"]:
        name = spec.get("name") or target(spec["conn"], "").rstrip(":")
        raise DdplabError(
            f"{name}: {spec['base']} needs {mib(need)} ({need} bytes, {len(files)} files) and its file "
            f"system ({room['path']}) has {mib(room['free'])} free ({room['free']} bytes); nothing was "
            f"copied. Free {mib(need - room['free'])} on {name}, or point the folder at a larger disk "
            "(ddplab_root, or the ddplab_sync_dirs dest)")
    return {"path": room["path"], "free": room["free"], "need": need}
