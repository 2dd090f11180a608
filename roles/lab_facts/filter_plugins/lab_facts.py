"""The lab's facts from the inventory, built in Python (roles/lab_facts/tasks/resolve.yml only fills them in):

    {{ groups['ddplab_nodes'] | lab_addrs(hostvars) }}  -> {node: ddplab_addr, else ansible_host, else name}
    {{ ddplab_root | home_path(home) }}                 -> ~ as the node's home, no trailing /
    {{ hostvars[node] | known_home }}                   -> the node's home as this command read it, or ''
    {{ groups['ddplab_nodes'] | run_hosts(hostvars, ddplab_scheduler, ddplab_slurm_nodes) }}
      -> the nodes a run trains on: every node; under Slurm with ddplab_slurm_nodes N, those of rank 0..N-1
"""

from __future__ import annotations

import json
import re


def lab_addrs(nodes: list[str], hostvars) -> dict[str, str]:
    """Every node's lab address as the inventory gives it: ddplab_addr, else ansible_host, else its name."""
    return {n: str(hostvars[n].get("ddplab_addr") or hostvars[n].get("ansible_host") or n) for n in nodes}


def home_path(path: str, home: str) -> str:
    """`path` with a leading ~ as `home` and without trailing slashes (a lab folder as the node names it)."""
    return re.sub("/+$", "", re.sub(r"^~(?=/|$)", lambda _: str(home), str(path)))


# The registered results that hold a node's home folder, first one that answered wins: lab_facts' own read,
# preflight's SSH check (its stdout is $HOME), the plan's ready probe (a relaunch; its JSON's "home").
HOME_READS = ("lab_facts_home", "preflight_ssh", "plan_ready")


def known_home(node_vars) -> str:
    """The node's home folder as a step of this command already read it, '' when none did (a skipped,
    failed or unreachable result counts as none)."""
    for name in HOME_READS:
        result = node_vars.get(name)
        if not isinstance(result, dict) or result.get("skipped") or result.get("unreachable") \
                or result.get("rc", 0) != 0 or not result.get("stdout"):
            continue
        if name != "plan_ready":
            return str(result["stdout"])
        try:
            said = json.loads(result["stdout"])
        except ValueError:
            continue
        if isinstance(said, dict) and said.get("home"):
            return str(said["home"])
    return ""


def run_hosts(nodes: list[str], hostvars, scheduler: str, slurm_nodes) -> list[str]:
    """The nodes a run trains on: all, or under Slurm with slurm_nodes N > 0 those whose ddplab_node_rank
    is below N (the others stay free for other jobs)."""
    if scheduler != "slurm" or int(slurm_nodes) == 0:
        return list(nodes)
    return [n for n in nodes if int(hostvars[n]["ddplab_node_rank"]) < int(slurm_nodes)]


class FilterModule:
    def filters(self):
        return {"lab_addrs": lab_addrs, "home_path": home_path, "known_home": known_home,
                "run_hosts": run_hosts}
