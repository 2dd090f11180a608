"""Does the run fit a node's memory: with DDP, sharded over the lab (ddplab_shard), or over more nodes?

Pure functions of the model's sizes (what the node's fingerprint read from the trainer flags: depth, width,
heads, sequence length, batch size, vocabulary, world size) and the bytes one rank has there. The estimate
is the trainer's own (trainer/sizes.py: 20 bytes a parameter with DDP, 16/N sharded over N plus the
gathered root and blocks, and the activations); preflight refuses a run that does not fit before launch and
says what would fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.sizes import AGENT_BYTES, GPTConfig, estimate_train_memory

SHARD_SETTING = "ddplab_shard"
MAX_NODES = 64  # the largest lab the advice proposes (trainer/shard.py has no limit)


SIZES = ("vocab", "seq_len", "depth", "n_embd", "n_head", "batch_size", "world_size")


def sizes_known(sizes) -> bool:
    """The fingerprint reported every size the estimate needs (an older nodeprobe may not)."""
    return isinstance(sizes, dict) and all(isinstance(sizes.get(k), int) for k in SIZES)


def need(sizes: dict, world: int, shard: bool) -> int:
    """Bytes one rank needs for this run's model at `world` ranks, with DDP or sharded."""
    c = GPTConfig(vocab_size=sizes["vocab"], seq_len=sizes["seq_len"], n_layer=sizes["depth"],
                  n_embd=sizes["n_embd"], n_head=sizes["n_head"])
    return estimate_train_memory(c, sizes["batch_size"], world, shard=shard)


def smallest_sharded_lab(sizes: dict, per_rank: int) -> int | None:
    """The fewest ranks (2..MAX_NODES) over which the sharded run fits `per_rank` bytes; None: none do."""
    return next((n for n in range(2, MAX_NODES + 1) if need(sizes, n, True) <= per_rank), None)


@dataclass
class Fit:
    ok: bool
    detail: str  # what was estimated against what is there
    fix: str = ""  # what to change when it does not fit


def judge(sizes: dict, available: int, ranks: int, host: str, shard: bool, gib) -> Fit:
    """The memory cell of `host`, which has `available` bytes for `ranks` ranks and torchrun's agent:
    fits, or the smallest layout that does (sharded over how many nodes), or by how much it misses
    however many nodes share the model."""
    per_rank = (available - AGENT_BYTES) // ranks
    world = int(sizes["world_size"])
    mine = need(sizes, world, shard)
    how = f"sharded over {world} nodes" if shard and world > 1 else "DDP"
    detail = f"~{gib(mine)} a rank estimated ({how}, trainer/sizes.py)"
    whom = f"each of its {ranks} ranks" if ranks > 1 else "a rank"
    room = f"{gib(per_rank)} available on {host} to {whom} (after {gib(AGENT_BYTES)} for torchrun's agent)"
    if mine <= per_rank:
        return Fit(True, f"{detail} <= {room}")
    detail = f"{detail} > {room}"
    nodes = smallest_sharded_lab(sizes, per_rank)
    if nodes is None:
        floor = need(sizes, MAX_NODES, True)
        return Fit(False, detail, f"it fits nowhere: even sharded over {MAX_NODES} nodes a rank needs "
                                  f"~{gib(floor)}, {gib(floor - per_rank)} more than {host} has; train a "
                                  f"smaller model (lower --depth / --batch-size / --seq-len) or free memory")
    sharded = need(sizes, max(nodes, world), True)
    if nodes <= world:
        return Fit(False, detail, f"fits sharded over {nodes} nodes (~{gib(sharded)} a rank over this lab's "
                                  f"{world}): set {SHARD_SETTING}: true")
    more = f"add {nodes - world} node{'s' if nodes - world > 1 else ''}"
    return Fit(False, detail, f"fits sharded over {nodes} nodes (~{gib(sharded)} a rank); this lab has "
                              f"{world}: {more}{'' if shard else f' and set {SHARD_SETTING}: true'}")
