"""The slurm row (ddplab_scheduler slurm): each node a working member of the lab's Slurm cluster, from
``gather``'s Slurm probe (nodeprobe/slurm_node.py). Without Slurm the row is n/a."""

from __future__ import annotations

from ddplab.preflight.judge import NA, OK, Judge
from ddplab.slurm_owner import mismatch

SETUP_FIX = "run playbooks/slurm.yml (it installs and starts munge and Slurm)"
# slurmctld refuses a request signed with another munge key with these words (Slurm 22.05)
AUTH_ERRORS = ("authentication", "Invalid credential", "credential")
CONTROLLER_LOG = "/var/log/slurm/slurmctld.log"
# sinfo's short states in which a job can start on the node (a trailing * means not responding)
READY = ("idle", "alloc", "mix", "comp", "plnd", "resv")


def slurm(j: Judge, h: str) -> None:
    if j.inv.get("scheduler") != "slurm":
        j.set(h, "slurm", NA, "ddplab_scheduler is none")
        return
    p = j.need(h, "slurm", "slurm")
    if not p:
        return
    controller = str(j.inv.get("slurm_controller") or j.master or "the controller")
    if p.get("missing"):
        j.fail(h, "slurm", f"{', '.join(p['missing'])} not installed on {h}", SETUP_FIX)
        return
    daemons = p.get("daemons") or {}
    munge = p.get("munge") or {}
    if not daemons.get("munged") or not munge.get("ok"):
        detail = ("munged is not running" if not daemons.get("munged")
                  else f"munge -n | unmunge: {munge.get('error')}")
        j.fail(h, "slurm", f"{detail} on {h}", SETUP_FIX)
        return
    # the run user's numbers, compared with the master's (or the first node that answered)
    ref = next((r for r in [j.master, *j.hosts] if r and (j.probe(r, "slurm") or {}).get("owner")), None)
    if ref and ref != h and p.get("owner"):
        differs = mismatch(ref, j.probe(ref, "slurm")["owner"], h, p["owner"])
        if differs:
            j.fail(h, "slurm", *differs)
            return
    stopped = [d for d in ("slurmd",) + (("slurmctld",) if h == controller else ()) if not daemons.get(d)]
    if stopped:
        j.fail(h, "slurm", f"{' and '.join(stopped)} not running on {h}", SETUP_FIX)
        return
    info = p.get("sinfo") or {}
    name = p.get("name") or h
    if not info.get("ok"):
        error = str(info.get("error") or "")
        if any(w in error for w in AUTH_ERRORS):
            j.fail(h, "slurm", f"slurmctld on {controller} refuses {h}'s munge credential ({error}): "
                               "the munge keys differ", f"{SETUP_FIX} (it gives every node the lab's key)")
        else:
            j.fail(h, "slurm", f"sinfo on {h}: {error}",
                   f"check slurmctld on {controller} ({CONTROLLER_LOG}), then {SETUP_FIX}")
        return
    state = str(info.get("state") or "")
    if state.rstrip("*~#!%$@^-") not in READY or state.endswith("*"):
        j.fail(h, "slurm", f"Slurm lists {name} as {state}: no job starts there",
               f"start slurmd on {h} ({SETUP_FIX}), then on {controller}: "
               f"sudo scontrol update nodename={name} state=resume")
        return
    j.set(h, "slurm", OK, f"munged, slurmd{' and slurmctld' if h == controller else ''} up; {name} {state}")
