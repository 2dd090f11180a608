"""The ufw rules the firewall role adds, as `ufw show added` prints them (ufw 0.36, Debian 12)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from ddplab.lab_tag import lab_tag, rule_comment

MASTER_PORT = 29500
ROOT_LAB = "~/ddplab"  # ddplab_root as the simlan inventory leaves it (the spec's default)
_PLUGIN = Path(__file__).resolve().parents[2] / "roles" / "firewall" / "filter_plugins" / "ufw_rules.py"
_spec = importlib.util.spec_from_file_location("ufw_rules", _PLUGIN)
ufw_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ufw_rules)


def lab_comment(master_addr: str, lab_root: str = ROOT_LAB) -> str:
    """The tag of one lab's rules, whose master's ddplab_root is `lab_root` as the inventory writes it
    (roles/firewall/defaults: firewall_comment)."""
    return rule_comment(lab_tag(master_addr, lab_root))


def ephemeral_ports(cluster, host: str) -> str:
    """The host's ip_local_port_range as ufw writes a range ("32768:60999"): gloo listens there."""
    lo, hi = cluster.exec(host, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"], timeout=30,
                          check=True).stdout.split()
    return f"{lo}:{hi}"


def peer_rules(peer: str, master_addr: str, ephemeral: str, port: int = MASTER_PORT,
               lab_root: str = ROOT_LAB) -> list[str]:
    """The two rules that let one peer in: the master port and the ports gloo listens on."""
    tag = lab_comment(master_addr, lab_root)
    return [f"ufw allow from {peer} to any port {p} proto tcp comment '{tag}'" for p in (port, ephemeral)]


def peer_rule_args(peer: str, master_addr: str, ephemeral: str, port: int = MASTER_PORT,
                   lab_root: str = ROOT_LAB) -> list[str]:
    """The same rules as `ufw` command arguments (what a test adds or deletes by hand)."""
    tag = lab_comment(master_addr, lab_root)
    return [rule.removeprefix("ufw ").replace(f"'{tag}'", tag)
            for rule in peer_rules(peer, master_addr, ephemeral, port, lab_root)]
