"""Who the lab's jobs run as (ddplab/slurm_owner.py decides; the tasks and the template use the answers).

    {{ id_stdout | slurm_run_user }}                  -> {user, uid, group, gid} (`id` of the login user)
    {{ groups['ddplab_nodes'] | slurm_owner_problem(hostvars) }}
      -> "" or one message naming both nodes, the user, both uids and gids and the fix
    {{ ddplab_slurm_allow_groups | slurm_allow_groups(hostvars[controller].slurm_id) }} -> "lab"
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ddplab.slurm_owner import owner_problem, run_user


def slurm_run_user(id_stdout: str) -> dict:
    found = run_user(id_stdout)
    if found is None:
        raise AnsibleFilterError(f"ddplab: error: `id` printed {id_stdout!r}, not uid=N(name) gid=N(name)")
    return found


def slurm_owner_problem(hosts: list[str], hostvars) -> str:
    return owner_problem({h: hostvars[h]["slurm_id"] for h in hosts})


def slurm_allow_groups(setting: str, controller_id: dict) -> str:
    """The partition's AllowGroups: the setting, else the run user's own group (names are resolved on the
    controller, which is where slurmctld checks them)."""
    return setting or controller_id["group"]


class FilterModule:
    def filters(self):
        return {"slurm_run_user": slurm_run_user, "slurm_owner_problem": slurm_owner_problem,
                "slurm_allow_groups": slurm_allow_groups}
