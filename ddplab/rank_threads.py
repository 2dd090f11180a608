"""Torch threads per rank for ``ddplab_threads: 0``: the CPUs a rank may use over the ranks sharing them.

The hosts of one inventory can be one machine: the local inventory's two hosts, simulated hosts (simlan),
containers on one box. Each of them sees every CPU of the machine, so the CPUs of a node over its own ranks
gave each rank all of them: on 2 cores, 2 ranks of 2 threads, whose OpenMP threads spin while they wait for
each other, trained the built-in model at 3,600-5,900 tokens/s against 18,100-18,600 with passive waiting
(30 steps, 2 rounds; a single rank with the 2 cores to itself loses a third with passive waiting, so the
fix is the thread count, not the wait policy).

A node's launch facts (nodeprobe/start_rank.py) say which kernel it runs on (its boot id: the same in every
container and namespace of one kernel, another on each machine and VM) and which CPUs its processes may
use (the affinity set). Ranks share a CPU when their hosts run on one kernel and their CPU sets meet.
"""

from __future__ import annotations


def rank_threads(host: str, nodes: dict[str, dict], threads: int = 0) -> int:
    """`threads` when set (> 0); else the CPUs `host`'s ranks may use over every rank that may use them too.

    nodes: {host: {"ranks": ranks on it, "cpus": [CPU ids it may use], "machine": boot id ("" unknown)}},
    the nodes of the run (`host` among them)."""
    if threads > 0:
        return threads
    me = nodes[host]
    cpus = set(me.get("cpus") or [])
    sharing = me["ranks"]
    if me.get("machine") and cpus:
        sharing = sum(n["ranks"] for n in nodes.values()
                      if n.get("machine") == me["machine"] and cpus & set(n.get("cpus") or []))
    return max(1, len(cpus) // max(1, sharing)) if cpus else 1
