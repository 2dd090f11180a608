"""``gather``'s Slurm probe (ddplab_scheduler slurm): is this node a working member of the lab's Slurm
cluster?

Facts only; the control host's verdict (``ddplab/preflight/checks_slurm.py``) decides:
- ``installed``: the commands the job needs (``munge``, ``unmunge``, ``sinfo``, ``sbatch``) are on PATH;
- ``munge``: a credential made and decoded on this node (``munge -n | unmunge``): munged runs and reads
  its key;
- ``daemons``: which of munged, slurmd and slurmctld run here (their process names in /proc);
- ``owner``: the login user's uid, gid and their names here (Slurm runs jobs under these numbers on
  every node, so they must be the same on all);
- ``sinfo``: this node as slurmctld sees it (``sinfo -N -n <hostname>``). The request is signed by
  munge and checked by slurmctld with its own key, so it fails when this node's key differs from the
  controller's; the state (idle, alloc, down*, drain, ...) says whether jobs can land here.
Runs as the login user: nothing here needs root.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import socket
import subprocess

from nodeprobe import procs

COMMANDS = ("munge", "unmunge", "sinfo", "sbatch")
DAEMONS = ("munged", "slurmd", "slurmctld")
TIMEOUT_S = 20  # sinfo waits up to slurm.conf's MessageTimeout (10 s by default) for a silent controller


def node_name() -> str:
    """The name slurmd registers under: the short hostname (roles/slurm/filter_plugins/slurm_conf.py)."""
    return socket.gethostname().split(".")[0]


def running(names=DAEMONS) -> dict[str, bool]:
    """Which of ``names`` have a process on this node (by /proc/<pid>/comm)."""
    found = {(procs._read(f"/proc/{pid}/comm") or "").strip() for pid in procs.pids()}
    return {name: name in found for name in names}


def _run(argv: list[str], stdin: bytes | None = None) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, input=stdin, capture_output=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]} did not answer within {TIMEOUT_S} s"
    except OSError as e:
        return 127, "", str(e)
    return p.returncode, p.stdout.decode(errors="replace").strip(), p.stderr.decode(errors="replace").strip()


def munge_round_trip() -> dict:
    rc, cred, err = _run(["munge", "-n"])
    if rc == 0:
        rc, _, err = _run(["unmunge"], stdin=cred.encode())
    return {"ok": rc == 0, "error": "" if rc == 0 else (err.splitlines() or [f"exit {rc}"])[-1]}


def sinfo_state(name: str) -> dict:
    rc, out, err = _run(["sinfo", "-h", "-N", "-n", name, "-o", "%t"])
    states = out.split()
    if rc != 0 or not states:
        return {"ok": False, "state": None,
                "error": (err.splitlines() or [f"slurmctld does not list {name}"])[-1]}
    return {"ok": True, "state": states[0], "error": ""}


def owner() -> dict:
    """The login user's numbers and names as the account database has them (`id NAME`; this process's own
    gid may predate a change, over a reused SSH connection)."""
    uid, gid = os.getuid(), os.getgid()
    try:
        entry = pwd.getpwuid(uid)
        user, gid = entry.pw_name, entry.pw_gid
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return {"uid": uid, "user": user, "gid": gid, "group": group}


def probe() -> dict:
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    name = node_name()
    if missing:
        return {"ok": True, "name": name, "missing": missing, "daemons": running()}
    return {"ok": True, "name": name, "missing": [], "daemons": running(), "munge": munge_round_trip(),
            "owner": owner(), "sinfo": sinfo_state(name)}
