"""Preflight's memory cell: DDP, sharded over the lab, sharded over more nodes, or nowhere (by how much)."""

from __future__ import annotations

import pytest

from ddplab.preflight import checks_node, memory_fit
from ddplab.preflight.collect import Inputs
from ddplab.preflight.judge import FAIL, OK, Judge, gib
from trainer.sizes import AGENT_BYTES

# depth 12, width 768 (~86M parameters), as the fingerprint reports the trainer flags
SIZES = {"depth": 12, "n_embd": 768, "n_head": 12, "seq_len": 128, "batch_size": 8, "vocab": 257,
         "world_size": 2}


def need(world, shard, **kw):
    return memory_fit.need(SIZES | kw, world, shard)


def judge(per_rank, shard=False, ranks=1, **kw):
    """The cell of a node with room for `ranks` ranks of `per_rank` bytes besides torchrun's agent."""
    return memory_fit.judge(SIZES | kw, ranks * per_rank + AGENT_BYTES, ranks, "node1", shard, gib)


def test_what_fits_ddp_passes_and_sharding_needs_less_the_more_nodes():
    assert need(2, True) < need(2, False) and need(4, True) < need(3, True) < need(2, True)
    fit = judge(need(2, False))
    assert fit.ok and "(DDP, trainer/sizes.py) <= " in fit.detail and "for torchrun's agent" in fit.detail
    assert not judge(need(2, False) - 1).ok  # the agent's share counts
    fit = judge(need(2, False), ranks=2)  # 2 ranks on one machine: each needs its own
    assert fit.ok and "available on node1 to each of its 2 ranks" in fit.detail


def test_over_one_node_with_ddp_the_advice_is_to_shard_over_the_smallest_lab_that_fits():
    fit = judge(need(2, True))  # fits sharded over 2, not with DDP
    assert not fit.ok and "> " in fit.detail and "available on node1" in fit.detail
    assert fit.fix == f"fits sharded over 2 nodes (~{gib(need(2, True))} a rank over this lab's 2): set " \
                      f"ddplab_shard: true"
    fit = judge(need(3, True), world_size=4)  # a lab of 4: 3 would do, sharding over all 4 needs less
    assert fit.fix.startswith("fits sharded over 3 nodes") and "this lab's 4" in fit.fix


def test_a_lab_too_small_even_sharded_is_told_how_many_nodes_to_add():
    fit = judge(need(4, True))
    assert not fit.ok
    assert fit.fix == f"fits sharded over 4 nodes (~{gib(need(4, True))} a rank); this lab has 2: add 2 " \
                      f"nodes and set ddplab_shard: true"
    fit = judge(need(3, True), shard=True)  # sharded already, over 2: one more node
    assert "sharded over 2 nodes" in fit.detail and fit.fix.endswith("this lab has 2: add 1 node")


def test_a_model_that_fits_nowhere_says_by_how_much():
    floor = need(memory_fit.MAX_NODES, True)
    fit = judge(floor - 2**30)
    assert not fit.ok
    assert fit.fix.startswith(f"it fits nowhere: even sharded over {memory_fit.MAX_NODES} nodes a rank needs "
                              f"~{gib(floor)}, 1.00 GiB more than node1 has")


@pytest.mark.parametrize("shard, status", [(False, FAIL), ("True", OK)])
def test_the_memory_cell_of_the_verdict_reads_ddplab_shard(shard, status):
    """The judge's memory cell from a fingerprint, as preflight-verdict builds it (shard comes from the
    bundle's inventory, a string when Ansible renders it so)."""
    fp = {"memory": {"available_bytes": need(2, True) + AGENT_BYTES, "estimate_bytes": need(2, False),
                     "sizes": SIZES,
                     "estimate_method": "trainer.model.estimate_train_memory"}}
    inv = {"shard": shard, "hosts": {h: {"rank": r, "addr": f"10.0.0.{r}", "local": False}
                                     for r, h in enumerate(("node0", "node1"))}}
    j = Judge(Inputs(inv, {h: {"fingerprint": fp} for h in inv["hosts"]}), None, None)
    checks_node.memory(j, "node1")
    cell = j.rows["node1"]["memory"]
    assert cell["status"] == status
    if status == FAIL:
        assert cell["fix"] == (f"fits sharded over 2 nodes (~{gib(need(2, True))} a rank over this lab's 2): "
                               f"set ddplab_shard: true")
    else:
        assert "sharded over 2 nodes" in cell["detail"]


def test_an_older_fingerprint_without_sizes_keeps_the_node_estimate():
    fp = {"memory": {"available_bytes": 10, "estimate_bytes": 20, "estimate_method": "own"}}
    j = Judge(Inputs({"hosts": {"n": {"rank": 0}}}, {"n": {"fingerprint": fp}}), None, None)
    checks_node.memory(j, "n")
    assert j.rows["n"]["memory"]["status"] == FAIL and "lower --depth" in j.rows["n"]["memory"]["fix"]
