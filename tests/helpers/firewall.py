"""The ufw rules the firewall role adds, as `ufw show added` prints them (ufw 0.36, Debian 12)."""

from __future__ import annotations

MASTER_PORT = 29500


def lab_comment(master_addr: str) -> str:
    """The tag of one lab's rules (roles/firewall/defaults: firewall_comment)."""
    return f"ddplab-lab-{master_addr}"


def ephemeral_ports(cluster, host: str) -> str:
    """The host's ip_local_port_range as ufw writes a range ("32768:60999"): gloo listens there."""
    lo, hi = cluster.exec(host, ["cat", "/proc/sys/net/ipv4/ip_local_port_range"], timeout=30,
                          check=True).stdout.split()
    return f"{lo}:{hi}"


def peer_rules(peer: str, master_addr: str, ephemeral: str, port: int = MASTER_PORT) -> list[str]:
    """The two rules that let one peer in: the master port and the ports gloo listens on."""
    tag = lab_comment(master_addr)
    return [f"ufw allow from {peer} to any port {p} proto tcp comment '{tag}'" for p in (port, ephemeral)]


def peer_rule_args(peer: str, master_addr: str, ephemeral: str, port: int = MASTER_PORT) -> list[str]:
    """The same rules as `ufw` command arguments (what a test adds or deletes by hand)."""
    return [rule.removeprefix("ufw ").replace(f"'{lab_comment(master_addr)}'", lab_comment(master_addr))
            for rule in peer_rules(peer, master_addr, ephemeral, port)]
