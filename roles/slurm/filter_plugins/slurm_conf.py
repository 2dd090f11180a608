"""The data of slurm.conf, built from the inventory and each node's facts (the template only fills it in).

    {{ groups['ddplab_nodes'] | slurm_conf(hostvars, ddplab_addrs, controller, srun_ports) }}
      -> {controller: {name, addr}, nodes: [{host, name, addr, cpus, real_memory}],
          partition: {name, nodes}, srun_ports}

Each node's row comes from its facts: name = ansible_hostname (slurmd knows itself by its short
hostname), cpus = ansible_processor_vcpus, memory = ansible_memtotal_mb; addr = its lab address.
A problem (two nodes with one hostname, a controller that is not a node, no CPUs) raises with the
host, the thing and the fix.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

PARTITION = "lab"
# Memory kept for the OS and the daemons: slurmd refuses a node whose RealMemory exceeds what it sees,
# and facts (MemTotal) may read a few MB above slurmd's own count.
MEMORY_SLACK_MB = 64


def _fail(host: str, thing: str, fix: str):
    raise AnsibleFilterError(f"ddplab: error: {host}: {thing}; {fix}")


def node_rows(hosts: list[str], hostvars, addrs: dict) -> list[dict]:
    rows = []
    for host in hosts:
        hv = hostvars[host]
        rows.append({"host": host, "name": hv.get("ansible_hostname"), "addr": addrs[host],
                     "cpus": hv.get("ansible_processor_vcpus"), "memory_mb": hv.get("ansible_memtotal_mb")})
    return rows


def slurm_nodes(nodes: list[dict]) -> list[dict]:
    seen: dict[str, str] = {}
    out = []
    for n in nodes:
        host, name = n["host"], str(n.get("name") or "")
        if not name:
            _fail(host, "no hostname in its facts", "run the playbook without --limit so facts are gathered")
        if name in seen:
            _fail(host, f"has the hostname {name!r} like {seen[name]} (Slurm names nodes by hostname)",
                  "give every node its own hostname (hostnamectl set-hostname)")
        seen[name] = host
        cpus, mem = int(n.get("cpus") or 0), int(n.get("memory_mb") or 0)
        if cpus < 1 or mem <= MEMORY_SLACK_MB:
            _fail(host, f"facts show {cpus} CPUs and {mem} MB", "check the node (ansible -m setup)")
        out.append({"host": host, "name": name, "addr": str(n["addr"]), "cpus": cpus,
                    "real_memory": mem - MEMORY_SLACK_MB})
    return sorted(out, key=lambda n: n["name"])


def slurm_conf(hosts: list[str], hostvars, addrs: dict, controller: str, srun_ports: str) -> dict:
    """Everything slurm.conf says about this lab; `controller` is an inventory name."""
    rows = slurm_nodes(node_rows(hosts, hostvars, addrs))
    ctl = [n for n in rows if n["host"] == controller]
    if not ctl:
        _fail(controller, "ddplab_slurm_controller is not a node of the lab",
              "set it to one of " + ", ".join(n["host"] for n in rows) + " (or \"\" for the master)")
    return {"controller": {"name": ctl[0]["name"], "addr": ctl[0]["addr"]}, "nodes": rows,
            "partition": {"name": PARTITION, "nodes": ",".join(n["name"] for n in rows)},
            "srun_ports": srun_ports}


def slurm_names(conf: dict) -> dict:
    """inventory name -> Slurm node name (the hostname), for the job and the checks."""
    return {n["host"]: n["name"] for n in conf["nodes"]}


def slurm_daemon_specs(daemons: list[dict], key_changed: bool, conf_changed: bool) -> list[dict]:
    """The spec of nodeprobe/daemons.py: a daemon restarts when what it reads (key, conf) changed."""
    changed = {"key": bool(key_changed), "conf": bool(conf_changed)}
    return [{"name": d["name"], "pidfile": d["pidfile"], "argv": list(d["argv"]), "log": d.get("log", ""),
             "restart": any(changed[c] for c in d.get("changed_by", []))} for d in daemons]


def slurm_missing_packages(dpkg_lines: list[str], packages: list[str]) -> list[str]:
    """The packages of `packages` that dpkg does not list as installed (`dpkg-query -W -f='${db:Status-Status}
    ${Package}\n'` lines; a package dpkg never heard of prints nothing)."""
    installed = {w[1] for w in (line.split() for line in dpkg_lines) if len(w) == 2 and w[0] == "installed"}
    return [p for p in packages if p not in installed]


class FilterModule:
    def filters(self):
        return {"slurm_conf": slurm_conf, "slurm_names": slurm_names,
                "slurm_daemon_specs": slurm_daemon_specs, "slurm_missing_packages": slurm_missing_packages}
