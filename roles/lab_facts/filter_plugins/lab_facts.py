"""The lab's facts from the inventory, built in Python (roles/lab_facts/tasks/resolve.yml only fills them in):

    {{ groups['ddplab_nodes'] | lab_addrs(hostvars) }}  -> {node: ddplab_addr, else ansible_host, else name}
    {{ ddplab_root | home_path(home) }}                 -> ~ as the node's home, no trailing /
    {{ groups['ddplab_nodes'] | run_hosts(hostvars, ddplab_scheduler, ddplab_slurm_nodes) }}
      -> the nodes a run trains on: every node; under Slurm with ddplab_slurm_nodes N, those of rank 0..N-1
"""

from __future__ import annotations

import re


def lab_addrs(nodes: list[str], hostvars) -> dict[str, str]:
    """Every node's lab address as the inventory gives it: ddplab_addr, else ansible_host, else its name."""
    return {n: str(hostvars[n].get("ddplab_addr") or hostvars[n].get("ansible_host") or n) for n in nodes}


def home_path(path: str, home: str) -> str:
    """`path` with a leading ~ as `home` and without trailing slashes (a lab folder as the node names it)."""
    return re.sub("/+$", "", re.sub(r"^~(?=/|$)", lambda _: str(home), str(path)))


def run_hosts(nodes: list[str], hostvars, scheduler: str, slurm_nodes) -> list[str]:
    """The nodes a run trains on: all, or under Slurm with slurm_nodes N > 0 those whose ddplab_node_rank
    is below N (the others stay free for other jobs)."""
    if scheduler != "slurm" or int(slurm_nodes) == 0:
        return list(nodes)
    return [n for n in nodes if int(hostvars[n]["ddplab_node_rank"]) < int(slurm_nodes)]


class FilterModule:
    def filters(self):
        return {"lab_addrs": lab_addrs, "home_path": home_path, "run_hosts": run_hosts}
