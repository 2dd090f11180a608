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

The all-reduce is what torch's `model_averaging.utils.average_parameters` does (flatten, divide by the
world size, one all-reduce, unflatten), on the parameters themselves for plain averaging (exactly what
torch's `PeriodicModelAverager` does) or on the parameter deltas for DiLoCo, into one flat buffer made at
the first sync and kept (a fresh one per sync pays its page faults every time: for the 128M model that
took longer than the transfer at 1 Gbit/s). With `--comm bf16` or
`fp16` the deltas travel in 16 bits (half the bytes of a sync; DiLoCo's outer gradients tolerate it, as
DDP's gradients tolerate its bf16 hook): the flat buffer is cast into a kept 16-bit one, all-reduced and
cast back, so every rank applies the same mean; plain averaging then keeps an anchor too (the parameters
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

from trainer import quant_wire
from trainer.config import UsageError
from trainer.metrics import percentile
from trainer.sync_schedule import sync_points


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
                 process_group=None, wire: str = "fp32", overlap: bool = False, per_step_until: int = 0,
                 fragments: int = 1, schedule: str = "constant", lr_ratio=None):
        self.params = [p for p in params]
        self.sync_every, self.steps = sync_every, steps
        self.per_step_until = per_step_until  # --sync-every-after: steps 1..N all-reduce gradients (DDP)
        self.outer_lr, self.outer_momentum = outer_lr, outer_momentum
        self.group = process_group
        self.wire_name, self.wire = wire, WIRE_DTYPES[wire]
        self.bits = quant_wire.BITS.get(wire)  # int8/int4: codes with a scale per block, all-gathered
        self.plain = outer_lr == 1.0 and outer_momentum == 0.0
        self.numel = sum(p.numel() for p in self.params)
        self.offsets = [0]  # where each parameter starts in the flat buffer, and the end
        for p in self.params:
            self.offsets.append(self.offsets[-1] + p.numel())
        self.fragments = split_fragments(self.offsets, fragments)  # --sync-fragments: (first, end) params
        # the steps after which a sync point falls (trainer/sync_schedule.py: every H/F steps, or stretched as
        # the learning rate, lr_ratio(step) of its peak, decays), and each one's place: whose turn it is
        self.schedule = schedule
        self.points = sync_points(steps, sync_every, fragments, per_step_until, schedule, lr_ratio)
        self.turn_of = {p: i for i, p in enumerate(self.points)}
        self.anchor: list[torch.Tensor] = []
        self.outer = None
        self.overlap = overlap
        self.pending = None  # --sync-overlap: (all-reduce work, its wire buffer, flat part, first, end)
        # made at the first sync and kept: a fresh buffer per sync costs its page faults again (for the 128M
        # model a 512 MB buffer's faults took longer than its 1 Gbit/s transfer)
        self.flat: torch.Tensor | None = None  # the outer gradient (or the parameters), flat, fp32
        self.views: list[torch.Tensor] = []  # flat, shaped as the parameters
        self.wire_buf: torch.Tensor | None = None  # what a 16-bit sync hands to the all-reduce
        self.snapshot: list[torch.Tensor] = []  # --sync-overlap: the parameters a started sync sent
        if not self.plain or self.wire != torch.float32 or overlap or len(self.fragments) > 1:
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

    @property
    def period(self) -> int:
        """Steps between sync points: H, or H / F with --sync-fragments F (one fragment per point)."""
        return self.sync_every // len(self.fragments)

    def due(self, done: int) -> bool:
        """Steps done so far (1-based) end with a sync point: one of `points` (by default every H-th step
        after the warm-up, every H/F-th with fragments), and the last."""
        return done in self.turn_of or done == self.steps

    def fragment_at(self, done: int) -> tuple[int, int]:
        """The parameters (first, end) whose turn the sync point after step `done` is: the fragments in
        order, one per sync point, so each one syncs every H steps (Streaming DiLoCo's staggered schedule)."""
        return self.fragments[self.turn_of[done] % len(self.fragments)]

    def sync_point(self, done: int, must_agree: bool) -> tuple[bool, bool]:
        """What step `done` (1-based) ends with: (sync, start): `sync` a blocking sync of every parameter,
        after which the ranks hold the same parameters; `start` a sync after which they do not: one
        fragment's (--sync-fragments), or one that lands at the next sync point (--sync-overlap). With either
        a sync point syncs everything only where the ranks must agree (`must_agree`: a check, checkpoint or
        evaluation is due) and at the run's last step."""
        if not self.due(done):
            return False, False
        if not self.overlap and len(self.fragments) == 1:
            return True, False
        blocking = done == self.steps or must_agree
        return blocking, not blocking

    def step_comm(self, sync: bool, start: bool, done: int) -> dict:
        """Run the step's sync (blocking, started, or none) and return its numbers in the form of DDP's
        gradient all-reduce (trainer.metrics.CommTimer): a blocking sync is exposed for the wait for the
        slowest rank, then the transfer; no gradient is all-reduced."""
        done = self.sync() if sync else self.exchange(done) if start else None
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
                (f"; in {len(self.fragments)} fragments, one every {self.period} steps (--sync-fragments)"
                 if len(self.fragments) > 1 else "") +
                (f"; the period stretched as the learning rate decays ({self.schedule}): "
                 f"{len(self.points)} sync points" if self.schedule != "constant" else "") +
                ("; each sync overlaps the next steps and lands one sync late (--sync-overlap)"
                 if self.overlap else ""))

    @property
    def bytes_per_sync(self) -> int:
        """What one sync of every parameter hands to the collective on each rank."""
        return self._bytes(0, len(self.params))

    def _bytes(self, first: int, end: int) -> int:
        """What a sync of parameters first..end-1 hands to the collective (int8/int4: codes and scales)."""
        numel = self.offsets[end] - self.offsets[first]
        if self.bits:
            return quant_wire.payload_bytes(numel, self.bits)
        fp32 = self.wire == torch.float32
        return numel * (self.params[0].element_size() if fp32 else self.wire.itemsize)

    def _buffers(self) -> torch.Tensor:
        """The flat fp32 buffer (and the 16-bit wire buffer), made at the first sync."""
        if self.flat is None:
            self.flat = torch.empty(self.numel, dtype=self.params[0].dtype, device=self.params[0].device)
            self.views = _split(self.flat, self.params)
            if not self.bits and self.wire != self.flat.dtype:
                self.wire_buf = torch.empty(self.numel, dtype=self.wire, device=self.flat.device)
        return self.flat

    def _share_of_outer_gradient(self, world: int, params: list[torch.Tensor], first: int,
                                 end: int) -> torch.Tensor:
        """(anchor - params) / world of parameters first..end-1 into their part of the flat buffer (returned):
        this rank's share of the mean outer gradient."""
        flat = self._buffers()[self.offsets[first]:self.offsets[end]]
        for i in range(first, end):
            torch.sub(self.anchor[i], params[i], out=self.views[i])
        return flat.div_(world)

    def _wire_of(self, flat: torch.Tensor, first: int, end: int) -> torch.Tensor:
        """The 16-bit wire buffer's part for parameters first..end-1, filled from their part `flat`."""
        return self.wire_buf[self.offsets[first]:self.offsets[end]].copy_(flat)

    def _mean_16bit(self, flat: torch.Tensor, first: int, end: int) -> dict:
        """Replace this rank's share in `flat` by the sum of all shares (the mean), sent as one 16-bit buffer
        (as DDP's bf16/fp16 compress hooks do: divide first, so fp16's range holds the sum)."""
        wire = self._wire_of(flat, first, end)
        timed = self._all_reduce(lambda: dist.all_reduce(wire, group=self.group))
        flat.copy_(wire)
        return timed

    def _mean_quantized(self, flat: torch.Tensor, world: int) -> dict:
        """Replace this rank's share in `flat` by the mean over the ranks, each share sent as int8/int4 codes
        with one fp32 scale per block and all-gathered (gloo cannot sum codes that carry their own scales);
        every rank decodes the same payloads in rank order, so every rank applies the same mean."""
        payload = quant_wire.encode(flat, self.bits)
        gathered = [torch.empty_like(payload) for _ in range(world)]
        timed = self._all_reduce(lambda: dist.all_gather(gathered, payload, group=self.group))
        flat.zero_()
        for g in gathered:
            flat.add_(quant_wire.decode(g, flat.numel(), self.bits))
        return timed

    def _mean_fp32(self, flat: torch.Tensor) -> dict:
        """Replace this rank's share in `flat` (already divided by the world size) by the sum of all shares:
        torch's average_parameters on one kept buffer (the same sum, bit for bit)."""
        return self._all_reduce(lambda: dist.all_reduce(flat, group=self.group))

    def _all_reduce(self, send) -> dict:
        """The ranks meet first (a one-number all-reduce: the wait for the slowest rank, whose H steps took
        longer), then `send` runs: its time is the transfer alone, what the link costs."""
        t0 = time.perf_counter()
        dist.all_reduce(torch.zeros(1, device=self.params[0].device), group=self.group)  # nccl: on the GPU
        t1 = time.perf_counter()
        send()
        return {"wait_ms": (t1 - t0) * 1e3, "sync_ms": (time.perf_counter() - t1) * 1e3}

    def _step_anchor(self, first: int, end: int) -> None:
        """The synchronized parameters first..end-1 move by their mean outer gradient (in the flat buffer's
        views); the outer optimizer steps only those (the others have no gradient)."""
        if self.outer is None:  # plain averaging: anchor - mean delta
            for i in range(first, end):
                self.anchor[i].sub_(self.views[i])
        else:
            for i in range(first, end):
                self.anchor[i].grad = self.views[i]
            self.outer.step()
            self.outer.zero_grad(set_to_none=True)

    def _sync_range(self, world: int, first: int, end: int) -> dict:
        """Blocking: parameters first..end-1 become their anchor moved by the mean outer gradient."""
        timed = {"wait_ms": 0.0, "sync_ms": 0.0}
        flat = self._share_of_outer_gradient(world, self.params, first, end)
        if world > 1 and self.bits:
            timed = self._mean_quantized(flat, world)
        elif world > 1 and self.wire_buf is not None:
            timed = self._mean_16bit(flat, first, end)
        elif world > 1:
            timed = self._mean_fp32(flat)
        self._step_anchor(first, end)
        for i in range(first, end):
            self.params[i].copy_(self.anchor[i])
        return timed

    @torch.no_grad()
    def exchange(self, done: int | None = None) -> dict:
        """All ranks at a sync point where they need not agree. --sync-fragments: sync the fragment whose
        turn it is (after step `done`); --sync-overlap: apply the all-reduce started at the previous
        point, then start this one from the parameters now (it lands at the next point). Returns the ms
        this blocked (with --sync-overlap the part of the transfer the steps did not hide, plus the copies)
        and the bytes sent."""
        t0 = time.perf_counter()
        self._finish_pending()
        world = dist.get_world_size(self.group) if dist.is_initialized() else 1
        first, end = self.fragment_at(done) if len(self.fragments) > 1 else (0, len(self.params))
        sent = self._bytes(first, end) if world > 1 else 0
        if not self.overlap:
            return self._sync_range(world, first, end) | {"sync_bytes": sent}
        if not self.snapshot:
            self.snapshot = [torch.empty_like(p) for p in self.params]
        for i in range(first, end):
            self.snapshot[i].copy_(self.params[i])
        flat = self._share_of_outer_gradient(world, self.snapshot, first, end)
        wire = flat if self.wire_buf is None else self._wire_of(flat, first, end)
        work = dist.all_reduce(wire, group=self.group, async_op=True) if world > 1 else None
        self.pending = (work, wire, flat, first, end)
        return {"wait_ms": 0.0, "sync_ms": (time.perf_counter() - t0) * 1e3, "sync_bytes": sent}

    def _finish_pending(self) -> None:
        """Wait for the pending all-reduce, step the anchor with its mean, keep the progress since."""
        if self.pending is None:
            return
        work, wire, flat, first, end = self.pending
        self.pending = None
        if work is not None:
            work.wait()
        if wire is not flat:
            flat.copy_(wire)
        self._step_anchor(first, end)
        for i in range(first, end):  # the new anchor plus what this rank learned since the snapshot
            self.params[i].sub_(self.snapshot[i]).add_(self.anchor[i])

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
        if not self.anchor:  # plain fp32 averaging: the parameters themselves (average_parameters)
            if world > 1:
                flat = self._buffers()
                for v, p in zip(self.views, self.params, strict=True):
                    v.copy_(p)
                timed = self._mean_fp32(flat.div_(world))
                for p, v in zip(self.params, self.views, strict=True):
                    p.copy_(v)
        else:
            timed = self._sync_range(world, 0, len(self.params))
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
        return {"sync_every": self.sync_every, "fragments": len(self.fragments), "schedule": self.schedule,
                "outer_lr": self.outer_lr, "sync_dtype": self.wire_name,
                "per_step_until": self.per_step_until,
                "outer_momentum": self.outer_momentum, "overlap": self.overlap,
                "outer_optimizer": "none (parameter averaging)" if self.plain else
                "SGD" + (" nesterov" if self.outer_momentum > 0 else ""),
                "syncs": len(synced), "bytes_per_sync": self.bytes_per_sync,
                "comm_bytes_per_step": total / len(records) if records else None,
                "sync_ms_p50": percentile([r["sync_ms"] for r in synced], 50),
                "sync_wait_ms_p50": percentile([r["sync_wait_ms"] for r in synced], 50)}


def split_fragments(offsets: list[int], count: int) -> list[tuple[int, int]]:
    """`count` runs of consecutive parameters (first, end), of about equal numbers of values, from the
    parameters' starts in the flat buffer (`offsets`, ending with the total); each run holds at least one."""
    n, total = len(offsets) - 1, offsets[-1]
    if not 1 <= count <= n:
        raise UsageError(f"--sync-fragments {count}: the model has {n} parameter tensors; use 1 to {n}")
    cuts, first = [], 0
    for k in range(1, count):
        # the first parameter that starts at or past k/count of the values, leaving one per later fragment
        end = next(i for i in range(first + 1, n + 1) if offsets[i] >= total * k / count or
                   i == n - (count - k))
        cuts.append((first, end))
        first = end
    return [*cuts, (first, n)]


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
