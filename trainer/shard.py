"""--shard: FSDP2 (`torch.distributed.fsdp.fully_shard`) per transformer block and the root, over gloo on CPU.

Each rank holds 1/N of every parameter (a DTensor sharded on dim 0), its gradient and its AdamW moments.
Before a block's forward its parameters are all-gathered; after its backward the full gradients are
reduce-scattered (averaged) so each rank keeps the mean gradient of its own shard. With
--reshard-after-forward (the default) a block frees its gathered parameters after forward and gathers
them again for backward: 2 all-gathers and 1 reduce-scatter of the parameters per step, against DDP's one
all-reduce of the gradients (on a ring: 3(N-1)/N against 2(N-1)/N of the model's bytes per rank and step).
The root (embedding and head) is gathered once per step and kept for backward, as FSDP2 does for it.

Measured on torch 2.13.0+cpu: FSDP2 calls gloo's all_gather_single / reduce_scatter_single synchronously
(async_op=False) on CPU, so each call's duration is the collective's whole time and none of it overlaps
compute. `ShardTimer` times every call through FSDP2's own hooks (`set_custom_all_gather`,
`set_custom_reduce_scatter`) and counts the bytes each call hands over: the gathered output of an
all-gather (the full parameters of a block), the full-gradient input of a reduce-scatter. A gradient
norm for --grad-clip is one more small all-reduce per step, not counted.

Gradient accumulation reduce-scatters after every micro-step (no `no_sync`): the full gradients are never
kept, which is the point of sharding; it costs one reduce-scatter per micro-step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter
from torch.distributed.tensor import DTensor

from trainer.metrics import percentile

# glibc's mallopt: allocations above this many bytes get their own mapping, returned to the system when freed
M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES = -3, 64 << 10

# the per-step record's own fields with --shard (metrics.rank{R}.jsonl)
STEP_KEYS = ("allgather_ms", "reduce_scatter_ms", "allgather_bytes", "reduce_scatter_bytes")


class ShardTimer:
    """Every all-gather and reduce-scatter FSDP2 runs in the current step: count, time, bytes.

    step_stats() has the keys of metrics.CommTimer's (allreduce_ms = the collectives' summed time; all of it
    is exposed, they run synchronously on CPU) plus the two kinds apart."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            self.ms = {"all_gather": 0.0, "reduce_scatter": 0.0}
            self.bytes = {"all_gather": 0, "reduce_scatter": 0}
            self.calls = 0

    def add(self, kind: str, seconds: float, nbytes: int) -> None:
        with self._lock:
            self.ms[kind] += seconds * 1e3
            self.bytes[kind] += nbytes
            self.calls += 1

    def step_stats(self) -> dict:
        with self._lock:
            total = self.ms["all_gather"] + self.ms["reduce_scatter"]
            return {"allreduce_ms": total, "exposed_ms": total,
                    "allreduce_bytes": self.bytes["all_gather"] + self.bytes["reduce_scatter"],
                    "buckets": self.calls, "allgather_ms": self.ms["all_gather"],
                    "reduce_scatter_ms": self.ms["reduce_scatter"],
                    "allgather_bytes": self.bytes["all_gather"],
                    "reduce_scatter_bytes": self.bytes["reduce_scatter"]}


def _timed(timer: ShardTimer, kind: str, call, nbytes: int):
    t0 = time.perf_counter()
    work = call()
    if work is not None:  # an asynchronous call (not on CPU today): time it to its end, honestly
        work.wait()
    timer.add(kind, time.perf_counter() - t0, nbytes)
    return work


class TimedAllGather(DefaultAllGather):
    """FSDP2's default all-gather, timed: the bytes are the gathered (full) parameters of one module."""

    def __init__(self, timer: ShardTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        return _timed(self.timer, "all_gather", lambda: super(TimedAllGather, self).__call__(
            output_tensor, input_tensor, group, async_op),
            output_tensor.numel() * output_tensor.element_size())


class TimedReduceScatter(DefaultReduceScatter):
    """FSDP2's default reduce-scatter, timed: the bytes are the full gradients of one module handed in."""

    def __init__(self, timer: ShardTimer):
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        return _timed(self.timer, "reduce_scatter", lambda: super(TimedReduceScatter, self).__call__(
            output_tensor, input_tensor, group, op, async_op),
            input_tensor.numel() * input_tensor.element_size())


def return_freed_memory() -> bool:
    """Pin glibc's mmap threshold, so the blocks' gathered parameters and full gradients, freed after each
    use, go back to the system. By default glibc raises the threshold each time a large mapping is freed,
    after which such buffers come from the heap and stay in the process: measured here (depth 4, width
    768, 2 ranks, 3 steps) a sharded rank's peak RSS was 1,107 MiB with the default, 652 MiB pinned
    (DDP: 835 and 810). False where the C library has no mallopt (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False


def shard_model(model: torch.nn.Module, reshard_after_forward: bool, timer: ShardTimer) -> torch.nn.Module:
    """Shard `model` in place over the default process group: each transformer block, then the root (its
    embedding and head); every rank keeps the dim-0 shard of the parameters it initialized. Returns it."""
    units = [*model.blocks, model]
    for block in model.blocks:
        fully_shard(block, reshard_after_forward=reshard_after_forward)
    fully_shard(model)
    for unit in units:
        unit.set_custom_all_gather(TimedAllGather(timer))
        unit.set_custom_reduce_scatter(TimedReduceScatter(timer))
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def local_numel(model: torch.nn.Module) -> int:
    """Parameters this rank holds (its shards; the whole model when not sharded)."""
    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in model.parameters())


def rank_facts(model: torch.nn.Module, records: list[dict], timing_skip: int) -> dict:
    """This rank's part of the summary: the parameters it holds and its collectives per step (medians of
    the timed steps)."""
    timed = records[timing_skip:] if len(records) > timing_skip else records[-1:]
    return {"params_local": local_numel(model),
            **{f"{k}_p50": percentile([r[k] for r in timed], 50) for k in STEP_KEYS}}


def run_facts(cfg, per_rank: list[dict]) -> dict:
    """The run summary's "shard": the layout and every rank's part (rank order)."""
    return {"reshard_after_forward": cfg.reshard_after_forward, "return_memory": cfg.shard_return_memory,
            "params_local": [r["params_local"] for r in per_rank],
            "allgather_bytes_per_step": per_rank[0]["allgather_bytes_p50"],
            "reduce_scatter_bytes_per_step": per_rank[0]["reduce_scatter_bytes_p50"],
            "allgather_ms_p50": per_rank[0]["allgather_ms_p50"],
            "reduce_scatter_ms_p50": per_rank[0]["reduce_scatter_ms_p50"]}


def describe(reshard_after_forward: bool, world: int, local: int, total: int) -> str:
    keep = ("frees each block's gathered parameters after forward (2 all-gathers + 1 reduce-scatter per "
            "step)" if reshard_after_forward else "keeps each block's gathered parameters from forward to "
            "backward (1 all-gather + 1 reduce-scatter per step)")
    return (f"ddplab: sharded (FSDP2) over {world} ranks: this rank holds {local:,} of {total:,} parameters "
            f"and their gradients and AdamW moments; {keep}")
