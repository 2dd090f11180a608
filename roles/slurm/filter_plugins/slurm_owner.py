"""Who the lab's jobs run as (the template and the tasks only use the answers).

Slurm runs a job's steps on every node under the submitter's numeric uid and gid (munge signs numbers, not
names). A run user who is uid 1000 on one node and uid 1001 on another would run as whoever is 1000 on
the second node: another person's account. So the lab is refused unless its run user has one uid and one
gid on every node, and the partition admits only the run user's group (AllowGroups).

    {{ id_stdout | slurm_run_user }}                  -> {user, uid, group, gid} (`id` of the login user)
    {{ groups['ddplab_nodes'] | slurm_owner_problem(hostvars) }}
      -> "" or one message naming both nodes, the user, both uids and gids and the fix
    {{ ddplab_slurm_allow_groups | slurm_allow_groups(hostvars[controller].slurm_id) }} -> "lab"
"""

from __future__ import annotations

import re

from ansible.errors import AnsibleFilterError

ID_LINE = re.compile(r"uid=(\d+)\(([^)]*)\) gid=(\d+)\(([^)]*)\)")


def slurm_run_user(id_stdout: str) -> dict:
    """`id` output ("uid=1000(lab) gid=1000(lab) groups=...") -> {user, uid, group, gid}."""
    m = ID_LINE.search(id_stdout or "")
    if not m:
        raise AnsibleFilterError(f"ddplab: error: `id` printed {id_stdout!r}, not uid=N(name) gid=N(name)")
    return {"uid": int(m[1]), "user": m[2], "gid": int(m[3]), "group": m[4]}


def slurm_owner_problem(hosts: list[str], hostvars) -> str:
    """The first pair of nodes whose run user differs in uid or gid, as one message; "" when none."""
    ids = {h: hostvars[h]["slurm_id"] for h in hosts}
    first = hosts[0]
    for host in hosts[1:]:
        a, b = ids[first], ids[host]
        if (a["uid"], a["gid"]) != (b["uid"], b["gid"]):
            return (f"ddplab: error: the run user differs between {first} and {host}: {a['user']} is uid "
                    f"{a['uid']} gid {a['gid']} on {first}, {b['user']} is uid {b['uid']} gid {b['gid']} on "
                    f"{host}. Slurm runs a job on every node under the submitter's numbers, so on {host} the "
                    f"lab's jobs would run as whoever has uid {a['uid']} there (and jobs from {host} as "
                    f"uid {b['uid']} on {first}). Give the account the same uid and gid on every node (as "
                    f"root on {host}: usermod -u {a['uid']} {b['user']}; groupmod -g {a['gid']} "
                    f"{b['group']}), or use an account that has them, then run playbooks/slurm.yml again. "
                    "Nothing was changed.")
    return ""


def slurm_allow_groups(setting: str, controller_id: dict) -> str:
    """The partition's AllowGroups: the setting, else the run user's own group (names are resolved on the
    controller, which is where slurmctld checks them)."""
    return setting or controller_id["group"]


class FilterModule:
    def filters(self):
        return {"slurm_run_user": slurm_run_user, "slurm_owner_problem": slurm_owner_problem,
                "slurm_allow_groups": slurm_allow_groups}
