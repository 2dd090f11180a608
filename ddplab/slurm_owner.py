"""Who a Slurm lab's jobs run as: one uid and gid of the run user on every node.

Slurm runs a job's steps on every node under the submitter's numeric uid and gid (munge signs numbers, not
names). A run user who is uid 1000 on one node and 1001 on another would run on the second node as whoever
is 1000 there: another person's account. playbooks/slurm.yml (roles/slurm/filter_plugins/slurm_owner.py)
refuses such a lab before any change, and preflight's slurm row (ddplab/preflight/checks_slurm.py) before a
run is submitted.
"""

from __future__ import annotations

import re

# `id` names a number only where the node has a name for it ("gid=1777" alone when no group has it)
ID_LINE = re.compile(r"uid=(\d+)(?:\(([^)]*)\))? gid=(\d+)(?:\(([^)]*)\))?")


def run_user(id_stdout: str) -> dict | None:
    """`id` output ("uid=1000(lab) gid=1000(lab) groups=...") -> {uid, user, gid, group} (a number without a
    name stands for its name); None if it is not that."""
    m = ID_LINE.search(id_stdout or "")
    if not m:
        return None
    return {"uid": int(m[1]), "user": m[2] or m[1], "gid": int(m[3]), "group": m[4] or m[3]}


def mismatch(first: str, a: dict, host: str, b: dict) -> tuple[str, str] | None:
    """(what differs, the fix) when the run user's numbers on `host` (b) differ from those on `first` (a)."""
    if (a["uid"], a["gid"]) == (b["uid"], b["gid"]):
        return None
    found = (f"the run user differs between {first} and {host}: {a['user']} is uid {a['uid']} gid {a['gid']} "
             f"on {first}, {b['user']} is uid {b['uid']} gid {b['gid']} on {host}. Slurm runs a job on every "
             f"node under the submitter's numbers, so on {host} the lab's jobs would run as whoever has uid "
             f"{a['uid']} there (and jobs from {host} as uid {b['uid']} on {first})")
    steps = [f"usermod -u {a['uid']} {b['user']}"] if a["uid"] != b["uid"] else []
    if a["gid"] != b["gid"]:  # groupmod renumbers the group, usermod -g the user's primary gid
        steps += [f"groupmod -g {a['gid']} {b['group']}", f"usermod -g {a['gid']} {b['user']}"]
    fix = (f"Give the account the same uid and gid on every node (as root on {host}: {'; '.join(steps)}), or "
           "use an account that has them, then run playbooks/slurm.yml again")
    return found, fix


def owner_problem(ids: dict[str, dict]) -> str:
    """The first node whose run user differs from the first node's, as one message; "" when none."""
    hosts = list(ids)
    for host in hosts[1:]:
        found = mismatch(hosts[0], ids[hosts[0]], host, ids[host])
        if found:
            return f"ddplab: error: {found[0]}. {found[1]}. Nothing was changed."
    return ""
