"""The data of a run's sbatch script (templates/sbatch.sh.j2 only fills it in).

    {{ scontrol_lines | slurm_node_addrs }}          -> {slurm node name: NodeAddr}
    {{ groups['ddplab_nodes'] | slurm_job(hostvars, ddplab_addrs, node_addrs) }}
      -> {nodes: [{host, name, addr, run_dir}] (Slurm's name order), names: "node0,node1", count: 2}

A node is matched to its Slurm name by its lab address (slurm.conf's NodeAddr, written by
playbooks/slurm.yml from the same inventory); a node Slurm does not know raises with the fix.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError


def slurm_node_addrs(lines: list[str]) -> dict:
    """`scontrol show nodes --oneliner` lines -> {NodeName: NodeAddr}."""
    out = {}
    for line in lines:
        fields = dict(w.split("=", 1) for w in line.split() if "=" in w)
        if fields.get("NodeName"):
            out[fields["NodeName"]] = fields.get("NodeAddr") or fields["NodeName"]
    return out


def slurm_job(hosts: list[str], hostvars, addrs: dict, node_addrs: dict) -> dict:
    by_addr = {addr: name for name, addr in node_addrs.items()}
    rows = []
    for host in hosts:
        name = by_addr.get(addrs[host])
        if name is None:
            raise AnsibleFilterError(
                f"ddplab: error: {host} ({addrs[host]}) is not a node of the Slurm cluster (its nodes: "
                + (", ".join(f"{n} {a}" for n, a in sorted(node_addrs.items())) or "none")
                + "); run playbooks/slurm.yml again after changing the inventory")
        rows.append({"host": host, "name": name, "addr": addrs[host],
                     "run_dir": hostvars[host]["ddplab_run_dir"]})
    rows.sort(key=lambda r: r["name"])
    return {"nodes": rows, "names": ",".join(r["name"] for r in rows), "count": len(rows)}


def slurm_squeue_state(lines: list[str]) -> dict:
    """`squeue --format=%i|%T|%r|%N` lines of one run's job name -> the newest job: {job, state, reason,
    nodes}; {job: "", state: "NONE"} when Slurm no longer knows it."""
    jobs = []
    for line in lines:
        parts = line.strip().split("|")
        if len(parts) == 4 and parts[0].isdigit():
            # reason None: slurmctld has not looked at the job yet (it does on its next scheduling pass)
            reason = "" if parts[2] == "None" else parts[2]
            jobs.append({"job": parts[0], "state": parts[1], "reason": reason, "nodes": parts[3]})
    if not jobs:
        return {"job": "", "state": "NONE", "reason": "", "nodes": ""}
    return max(jobs, key=lambda j: int(j["job"]))


class FilterModule:
    def filters(self):
        return {"slurm_node_addrs": slurm_node_addrs, "slurm_job": slurm_job,
                "slurm_squeue_state": slurm_squeue_state}
