"""Read an Ansible inventory the way ansible-playbook does (via `ansible-inventory --list`)."""

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from ddplab.errors import DdplabError


@dataclass
class Node:
    name: str
    rank: int
    connection: str
    host: str
    port: int | None  # None: ssh's own (~/.ssh/config, else 22)
    user: str | None
    key_file: str | None
    root: str
    ssh_args: str = ""  # ansible_ssh_common_args and ansible_ssh_extra_args, as ssh options
    scheduler: str = "none"  # ddplab_scheduler: none (ranks in tmux) or slurm


def _ansible_inventory():
    here = os.path.join(os.path.dirname(sys.executable), "ansible-inventory")
    return here if os.path.exists(here) else shutil.which("ansible-inventory") or "ansible-inventory"


@functools.lru_cache(maxsize=4)
def _inventory_list(inventory) -> dict:
    """`ansible-inventory --list` of the inventory (group_vars and host_vars merged into hostvars)."""
    if not os.path.exists(inventory):
        raise DdplabError(f"inventory {inventory} does not exist; pass -i inventory/<name>")
    try:
        out = subprocess.run([_ansible_inventory(), "-i", inventory, "--list"], capture_output=True,
                             text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DdplabError(f"cannot run ansible-inventory: {e}; install ansible-core (make setup)") from e
    if out.returncode != 0:
        raise DdplabError(f"ansible-inventory -i {inventory} failed: {out.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.stdout)


def load_hostvars(inventory) -> dict:
    """Each host's variables as ansible-playbook resolves them (unrendered Jinja stays a string)."""
    return _inventory_list(inventory).get("_meta", {}).get("hostvars", {})


def load_nodes(inventory):
    data = _inventory_list(inventory)
    hostvars = data.get("_meta", {}).get("hostvars", {})
    names = set()

    def walk(group):
        g = data.get(group, {})
        names.update(g.get("hosts", []))
        for child in g.get("children", []):
            walk(child)

    walk("ddplab_nodes")
    if not names:
        raise DdplabError(f"inventory {inventory} has no hosts in group ddplab_nodes (see inventory/example)")
    nodes = []
    for name in names:
        hv = hostvars.get(name, {})
        nodes.append(Node(
            name=name, rank=int(hv.get("ddplab_node_rank", 0)),
            connection=hv.get("ansible_connection", "ssh"),
            host=hv.get("ansible_host", name),
            port=int(hv["ansible_port"]) if hv.get("ansible_port") not in (None, "") else None,
            user=hv.get("ansible_user"),
            key_file=hv.get("ansible_ssh_private_key_file") or hv.get("ansible_private_key_file"),
            root=hv.get("ddplab_root", "~/ddplab"),
            ssh_args=" ".join(str(hv.get(k) or "") for k in ("ansible_ssh_common_args",
                                                              "ansible_ssh_extra_args")).strip(),
            scheduler=hv.get("ddplab_scheduler", "none")))
    return sorted(nodes, key=lambda n: n.rank)
