"""Checks of the inventory itself and of SSH: run first, before any probe result is read."""

from __future__ import annotations

from ddplab.preflight.judge import OK, Judge, loopback


def inventory(j: Judge) -> None:
    masters = j.masters()
    for h in j.hosts:
        j.set(h, "inventory", OK, f"rank {j.hosts[h].get('rank')}, addr {j.addr(h)}")
    if not masters:
        for h in j.hosts:
            j.fail(h, "inventory", "no master: no host in ddplab_master (rank 0)",
                      "put exactly one host in the ddplab_master group")
    elif len(masters) > 1:
        for h in masters:
            j.fail(h, "inventory", f"{len(masters)} masters: {', '.join(masters)}",
                      "keep exactly one host in ddplab_master")
    n = len(j.hosts)
    by_rank: dict = {}
    for h, v in j.hosts.items():
        by_rank.setdefault(v.get("rank"), []).append(h)
    for rank, hs in by_rank.items():
        if not isinstance(rank, int) or not 0 <= rank < n:
            for h in hs:
                j.fail(h, "inventory", f"ddplab_node_rank {rank!r} is outside 0..{n - 1}",
                          f"set ddplab_node_rank of {h} to a unique number in 0..{n - 1}")
        elif len(hs) > 1:
            for h in hs:
                j.fail(h, "inventory", f"rank {rank} is used by {', '.join(hs)}",
                          f"give each host a unique ddplab_node_rank in 0..{n - 1}")
    if j.master and j.hosts[j.master].get("rank") != 0:
        j.fail(j.master, "inventory", "the master must have ddplab_node_rank 0",
                  f"set ddplab_node_rank: 0 for {j.master}")
    if n > 1 and not j.all_local:
        by_addr: dict = {}
        for h in j.hosts:
            by_addr.setdefault(j.addr(h), []).append(h)
            if loopback(j.addr(h)):
                j.fail(h, "inventory", f"address {j.addr(h)} is loopback: peers cannot reach it",
                          f"set ddplab_addr of {h} to its LAN address")
        for a, hs in by_addr.items():
            if len(hs) > 1:
                for h in hs:
                    j.fail(h, "inventory", f"address {a} is shared by {', '.join(hs)}",
                              f"set ddplab_addr of {h} to its own address")


def ssh(j: Judge, h: str) -> None:
    ssh = j.probe(h, "ssh")
    if ssh and ssh.get("ok") is False:
        err = ssh.get("error") or ssh.get("msg") or "unreachable"
        j.fail(h, "ssh", f"cannot reach {h} ({j.addr(h)}) over SSH: {err}",
                  f"start sshd on {h} and check `ansible {h} -m ansible.builtin.ping`")
    else:
        j.set(h, "ssh", OK, "reached")


def left_out_ssh(j: Judge, h: str) -> None:
    """A node left out by --limit is asked only for its links with the chosen nodes (preflight-outside):
    its ssh row says whether it answered; without that step (an older dump) the row stays n/a."""
    ssh = j.probe(h, "ssh")
    if not ssh:
        return
    if ssh.get("ok") is False:
        chosen = ", ".join(x for x in j.hosts if x not in j.left_out)
        j.fail(h, "ssh", f"{h} (left out by --limit) did not answer over SSH, so its links with {chosen} are "
                         f"unknown: {ssh.get('error') or 'unreachable'}",
               f"start sshd on {h} and check `ansible {h} -m ansible.builtin.ping`, then re-run preflight")
    else:
        j.set(h, "ssh", OK, "reached (left out by --limit: only its links with the chosen nodes are checked)")
