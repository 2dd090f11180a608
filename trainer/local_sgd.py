"""Low-communication mode (`--sync-every H > 1`): local SGD / DiLoCo on top of the DDP loop.

Every rank takes H inner optimizer steps on its own data with no gradient all-reduce (train.py runs
every micro-step under DDP's `no_sync()`, so DDP's reducer and the comm hook stay idle), then the
ranks synchronize once:

- `--outer-lr 1 --outer-momentum 0`: plain local SGD, the ranks' parameters are averaged;
- otherwise DiLoCo (Douillard et al. 2023): the outer gradient is the mean over ranks of
  (parameters at the last sync - this rank's parameters now), and an outer Nesterov SGD
  (`torch.optim.SGD(nesterov=True)`, lr `--outer-lr`, momentum `--outer-momentum`) steps the
  synchronized parameters with it. Every rank holds the same outer state and applies the same
  all-reduced gradient, so parameters are bit-identical after every sync (checked by agreement.py).

The all-reduce is torch's own `model_averaging.utils.average_parameters` (flatten, divide by the world
size, one all-reduce, unflatten), on the parameters themselves for plain averaging (exactly what
torch's `PeriodicModelAverager` does) or on the parameter deltas for DiLoCo. With `--comm bf16` or
`fp16` the deltas travel in 16 bits (half the bytes of a sync; DiLoCo's outer gradients tolerate it, as
DDP's gradients tolerate its bf16 hook): they are flattened into one buffer, cast, all-reduced and cast
back, so every rank applies the same mean; plain averaging then keeps an anchor too (the parameters
themselves must not be rounded to 16 bits). Not used, and why:
`PeriodicModelAverager` only averages parameters (no outer optimizer) and keeps its own step counter
that would need checkpointing; the post-local-SGD comm hook needs DDP's one hook slot (held by
trainer/comm.py) and still all-reduces gradients every step within per-node subgroups.

With `--sync-overlap` a sync no longer blocks: at each sync point the rank snapshots its parameters,
starts the all-reduce of (snapshot - anchor) asynchronously (gloo runs it on its own thread) and goes on
training; at the next sync point it waits for that all-reduce (usually done by then: H steps of compute
hid the transfer), moves the anchor by the mean change (or the outer step), and keeps the progress made
meanwhile: parameters = new anchor + (parameters now - snapshot). This is overlap local SGD (Wang et al.
2020) / Streaming DiLoCo's overlapped communication (Douillard et al. 2025) with the whole model as one
fragment, a delay of H steps, and the local progress kept rather than mixed (torchft's
`fragment_update_alpha` 0 throws it away). The ranks then agree only where a check, checkpoint,
evaluation or the run's end is due: there the pending all-reduce is finished and a blocking sync follows.

`--sync-every-after N` (post-local SGD, Lin et al. 2020, "Don't use large mini-batches, use local SGD")
runs the first N steps as plain DDP (gradients all-reduced every step, counted in the bytes) and only then
starts the local steps; the anchor is taken after step N, when the ranks agree. `--comm int8` (or int4)
sends each rank's share of the outer gradient as 8-bit (4-bit) codes with one fp32 scale per block
(trainer/quant_wire.py),
all-gathered rather than all-reduced: gloo cannot sum codes that carry their own scales, and it sums
16-bit types slowly. The ranks decode the same payloads in the same order, so they still agree bit for bit.

Inner optimizer states (AdamW moments) stay per rank, as in DiLoCo; checkpoints keep every rank's.
The last step of a run always synchronizes, so the final checkpoint and checksum follow a sync.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.model_averaging.utils import average_parameters

from trainer import quant_wire
from trainer.metrics import percentile


def crossed(every: int, prev: int, done: int) -> bool:
    """A multiple of `every` lies in (prev, done]: a check or checkpoint due since the last sync is done
    now (with a sync every step, prev = done - 1 and this is `done % every == 0`). every 0: never."""
    return every > 0 and done // every > prev // every


# what a sync's all-reduce sends (--comm with --sync-every > 1); int8/int4 codes are all-gathered
# (trainer/quant_wire.py)
WIRE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "int8": torch.int8,
               "int4": torch.int8}


class LocalSGD:
    """The outer loop of local SGD / DiLoCo over `params` (the bare model's parameters, in order)."""

    def __init__(self, params, sync_every: int, steps: int, outer_lr: float, outer_momentum: float,
                 process_group=None, wire: str = "fp32", overlap: bool = False, per_step_until: int = 0):
        self.params = [p for p in params]
        self.sync_every, self.steps = sync_every, steps
        self.per_step_until = per_step_until  # --sync-every-after: steps 1..N all-reduce gradients (DDP)
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.group = process_group
        self.wire_name, self.wire = wire, WIRE_DTYPES[wire]
        self.bits = quant_wire.BITS.get(wire)  # int8/int4: codes with a scale per block, all-gathered
        self.plain = outer_lr == 1.0 and outer_momentum == 0.0
        self.numel = sum(p.numel() for p in self.params)
        self.anchor: list[torch.Tensor] = []
        self.outer = None
        self.overlap = overlap
        self.pending = None  # --sync-overlap: (all-reduce work, wire buffer, snapshot of the parameters)
        if not self.plain or self.wire != torch.float32 or overlap:
            # the synchronized parameters; the outer step moves these, then they are copied back
            self.anchor = [p.detach().clone() for p in self.params]
        if not self.plain:
            self.outer = torch.optim.SGD(self.anchor, lr=outer_lr, momentum=outer_momentum,
                                         nesterov=outer_momentum > 0)

    @torch.no_grad()
    def reset_anchor(self) -> None:
        """The current parameters are the synchronized ones (after DDP's broadcast or a resume)."""
        if not self.anchor:  # plain fp32 averaging keeps none
            return
        for a, p in zip(self.anchor, self.params, strict=True):
            a.copy_(p)

    def per_step(self, done: int) -> bool:
        """Step `done` (1-based) is one of the --sync-every-after warm-up steps: DDP all-reduces its gradients
        and the ranks agree after it, as with --sync-every 1 (post-local SGD, Lin et al. 2020)."""
        return done <= self.per_step_until

    def due(self, done: int) -> bool:
        """Steps done so far (1-based) end with a sync: every H-th step after the warm-up, and the last."""
        if self.per_step(done):
            return False
        return (done - self.per_step_until) % self.sync_every == 0 or done == self.steps

    def sync_point(self, done: int, must_agree: bool) -> tuple[bool, bool]:
        """What step `done` (1-based) ends with: (sync, start): `sync` a blocking sync, after which the ranks
        hold the same parameters; `start` (--sync-overlap) a sync that lands at the next sync point. With
        --sync-overlap a sync point blocks only where the ranks must agree (`must_agree`: a check,
        checkpoint or evaluation is due) and at the run's last step."""
        if not self.due(done):
            return False, False
        if not self.overlap:
            return True, False
        blocking = done == self.steps or must_agree
        return blocking, not blocking

    def step_comm(self, sync: bool, start: bool) -> dict:
        """Run the step's sync (blocking, started, or none) and return its numbers in the form of DDP's
        gradient all-reduce (trainer.metrics.CommTimer): a blocking sync is exposed for the wait for the
        slowest rank, then the transfer; no gradient is all-reduced."""
        done = self.sync() if sync else self.exchange() if start else None
        done = done or {"sync_ms": 0.0, "wait_ms": 0.0, "sync_bytes": 0}
        return {"allreduce_ms": done["sync_ms"], "exposed_ms": done["wait_ms"] + done["sync_ms"],
                "allreduce_bytes": done["sync_bytes"], "buckets": 1 if done["sync_bytes"] else 0}

    @staticmethod
    def step_fields(comm: dict, started: bool) -> dict:
        """The step record's local-SGD fields: the transfer, the wait before it, a sync started here."""
        return {"sync_ms": comm["allreduce_ms"], "sync_wait_ms": comm["exposed_ms"] - comm["allreduce_ms"],
                "overlapped": started}  # a sync started here lands at the next sync point

    def describe(self) -> str:
        """The banner line of the low-communication mode."""
        warm = (f"{self.per_step_until} steps with a per-step all-reduce (--sync-every-after), then "
                if self.per_step_until else "")
        return (f"ddplab: low-communication mode: {warm}{self.sync_every} local steps per sync, then " +
                ("the parameters are averaged" if self.plain else
                 f"an outer SGD step (lr {self.outer_lr}, Nesterov momentum {self.outer_momentum}) on the "
                 f"averaged parameter change") +
                f"; {self.bytes_per_sync / 1e6:.2f} MB per sync in {self.wire_name} (--allow-local-sgd)" +
                ("; each sync overlaps the next steps and lands one sync late (--sync-overlap)"
                 if self.overlap else ""))

    @property
    def bytes_per_sync(self) -> int:
        """What one sync hands to the collective on each rank (for int8, the codes and the block scales)."""
        if self.bits:
            return quant_wire.payload_bytes(self.numel, self.bits)
        fp32 = self.wire == torch.float32
        return self.numel * (self.params[0].element_size() if fp32 else self.wire.itemsize)

    def _mean_16bit(self, deltas: list[torch.Tensor], world: int) -> dict:
        """Replace `deltas` by their mean over the ranks, sent as one 16-bit buffer (as DDP's
        bf16/fp16 compress hooks do: divide first, so fp16's range holds the sum)."""
        flat = torch.cat([d.reshape(-1) for d in deltas]).div_(world)
        wire = flat.to(self.wire)
        timed = self._all_reduce(lambda: dist.all_reduce(wire, group=self.group))
        flat.copy_(wire)
        for d, f in zip(deltas, _split(flat, deltas), strict=True):
            d.copy_(f)
        return timed

    def _mean_quantized(self, deltas: list[torch.Tensor], world: int) -> dict:
        """Replace `deltas` by their mean over the ranks, each rank's share (delta / world) sent as int8/int4
        codes with one fp32 scale per block and all-gathered (gloo cannot sum codes that carry their own
        scales); every rank decodes the same payloads in rank order, so every rank applies the same mean."""
        flat = torch.cat([d.reshape(-1) for d in deltas]).div_(world)
        payload = quant_wire.encode(flat, self.bits)
        gathered = [torch.empty_like(payload) for _ in range(world)]
        timed = self._all_reduce(lambda: dist.all_gather(gathered, payload, group=self.group))
        flat.zero_()
        for g in gathered:
            flat.add_(quant_wire.decode(g, flat.numel(), self.bits))
        for d, f in zip(deltas, _split(flat, deltas), strict=True):
            d.copy_(f)
        return timed

    def _all_reduce(self, send) -> dict:
        """The ranks meet first (a one-number all-reduce: the wait for the slowest rank, whose H steps took
        longer), then `send` runs: its time is the transfer alone, what the link costs."""
        t0 = time.perf_counter()
        dist.all_reduce(torch.zeros(1, device=self.params[0].device), group=self.group)  # nccl: on the GPU
        t1 = time.perf_counter()
        send()
        return {"wait_ms": (t1 - t0) * 1e3, "sync_ms": (time.perf_counter() - t1) * 1e3}

    def _step_anchor(self, deltas: list[torch.Tensor]) -> None:
        """The synchronized parameters move by the mean outer gradient (anchor - parameters)."""
        if self.outer is None:  # plain averaging: anchor - mean delta
            for a, d in zip(self.anchor, deltas, strict=True):
                a.sub_(d)
        else:
            for a, d in zip(self.anchor, deltas, strict=True):
                a.grad = d
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def exchange(self) -> dict:
        """--sync-overlap, all ranks at a sync point: apply the all-reduce started at the previous one,
        then start the next from the parameters now. Returns the ms this blocked (the part of the
        transfer H steps did not hide, plus the copies) and the bytes sent."""
        t0 = time.perf_counter()
        self._finish_pending()
        world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        snapshot = [p.detach().clone() for p in self.params]
        flat = torch.cat([(a - s).reshape(-1) for a, s in zip(self.anchor, snapshot, strict=True)])
        flat.div_(world)
        wire = flat if self.wire == flat.dtype else flat.to(self.wire)
        work = dist.all_reduce(wire, group=self.group, async_op=True) if world > 1 else None
        self.pending = (work, wire, snapshot)
        return {"wait_ms": 0.0, "sync_ms": (time.perf_counter() - t0) * 1e3,
                "sync_bytes": self.bytes_per_sync if world > 1 else 0}

    def _finish_pending(self) -> None:
        """Wait for the pending all-reduce, step the anchor with its mean, keep the progress since."""
        if self.pending is None:
            return
        work, wire, snapshot = self.pending
        self.pending = None
        if work is not None:
            work.wait()
        self._step_anchor(_split(wire.to(torch.float32), self.anchor))
        for p, a, s in zip(self.params, self.anchor, snapshot, strict=True):
            p.sub_(s).add_(a)  # the new anchor plus what this rank learned since the snapshot

    @torch.no_grad()
    def sync(self) -> dict:
        """All ranks: average (plain) or outer-step (DiLoCo); with --sync-overlap the pending all-reduce is
        applied first. Returns the ms waiting for the other ranks, the ms of the all-reduce and its
        bytes."""
        world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        t0 = time.perf_counter()
        self._finish_pending()
        pending_ms = (time.perf_counter() - t0) * 1e3
        timed = {"wait_ms": 0.0, "sync_ms": 0.0}
        if not self.anchor:  # plain fp32 averaging: the parameters themselves
            if world > 1:
                timed = self._all_reduce(lambda: average_parameters(iter(self.params), self.group))
        else:
            deltas = [a - p for a, p in zip(self.anchor, self.params, strict=True)]  # outer gradient
            if world > 1 and self.bits:
                timed = self._mean_quantized(deltas, world)
            elif world > 1 and self.wire != torch.float32:
                timed = self._mean_16bit(deltas, world)
            elif world > 1:  # average_parameters rebinds each delta's .data to the mean
                timed = self._all_reduce(lambda: average_parameters(iter(deltas), self.group))
            self._step_anchor(deltas)
            for p, a in zip(self.params, self.anchor, strict=True):
                p.copy_(a)
        timed["sync_ms"] += pending_ms
        return timed | {"sync_bytes": self.bytes_per_sync if world > 1 else 0}

    def state_dict(self) -> dict:
        """The outer optimizer's state (the anchor equals the parameters right after a sync)."""
        return {"outer": self.outer.state_dict() if self.outer is not None else None}

    def checkpoint_fields(self, inner: torch.optim.Optimizer) -> dict:
        """Every rank: what a checkpoint adds in this mode (rank 0 gets every rank's inner optimizer state:
        DiLoCo keeps them per rank)."""
        return {"optim_ranks": gather_to_main(inner.state_dict()), "local_sgd": self.state_dict()}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        """After the model's parameters were loaded from a checkpoint written right after a sync."""
        self.reset_anchor()
        if self.outer is not None:
            if state.get("outer") is None:
                raise ValueError("the checkpoint has no outer optimizer state (written with plain averaging)")
            self.outer.load_state_dict(state["outer"])

    def summary(self, records: list[dict]) -> dict:
        synced = [r for r in records
                  if (r.get("synced") or r.get("overlapped")) and not self.per_step(r["step"])]
        total = sum(r["allreduce_bytes"] for r in records)
        return {"sync_every": self.sync_every, "outer_lr": self.outer_lr, "sync_dtype": self.wire_name,
                "per_step_until": self.per_step_until,
                "outer_momentum": self.outer_momentum, "overlap": self.overlap,
                "outer_optimizer": "none (parameter averaging)" if self.plain else
                "SGD" + (" nesterov" if self.outer_momentum > 0 else ""),
                "syncs": len(synced), "bytes_per_sync": self.bytes_per_sync,
                "comm_bytes_per_step": total / len(records) if records else None,
                "sync_ms_p50": percentile([r["sync_ms"] for r in synced], 50),
                "sync_wait_ms_p50": percentile([r["sync_wait_ms"] for r in synced], 50)}


def _split(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of one flat buffer shaped as the tensors of `like`, in order."""
    return [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in like]), like, strict=True)]


def gather_to_main(obj):
    """Every rank's `obj` on rank 0 (a list in rank order), None elsewhere; [obj] on one process."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
