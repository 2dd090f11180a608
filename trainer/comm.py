"""How gradients travel between ranks: one DDP communication hook, its option chosen by --comm.

Options (torch's built-in DDP comm hooks):
- fp32: DDP's own all-reduce (`allreduce_hook`, same result as no hook).
- bf16 / fp16: the bucket is cast to 16 bits and divided by the world size before the all-reduce and
  cast back after (`bf16_compress_hook` / `fp16_compress_hook`): half the bytes, ~3 significant digits.
- powersgd: rank-r PowerSGD (`powerSGD_hook` with a `PowerSGDState`, error feedback on): each matrix
  gradient travels as two thin factors P (n x r) and Q (m x r); vectors travel uncompressed. The first
  `--powersgd-start-step` steps are plain all-reduces (torch's recommendation; 2 is its minimum).
- auto: measure, then choose (see `GradComm`).

Every rank applies the same gradient with every option: the compressed all-reduce results are identical
on all ranks and decompression is deterministic, so parameters stay byte-identical (checked by the
trainer's parameter checksum, exit 3 otherwise).

DDP accepts one hook per model, so `GradComm` registers a single dispatcher whose current option can be
switched between steps (for `auto`). The dispatcher times every bucket (launch -> result ready) in the
trainer's `CommTimer` and counts the bytes each rank really hands to the all-reduce: the bucket for
fp32, half of it for bf16/fp16, P + Q + uncompressed vectors for PowerSGD (from the PowerSGD state's
own count of elements after compression).

`--comm auto` (world size > 1): after `max(1, --timing-warmup-steps)` fp32 warm-up steps, one untimed
first step for each lossy candidate (PowerSGD allocates and orthogonalises then), then `--auto-trial-steps`
rounds (>= 3) in which every candidate in `AUTO_CANDIDATES` runs one timed step, the order rotated each
round, so a busy moment on a node does not land on one option only. Every rank follows the same plan
(the option of a step depends only on its number). Rank 0 gathers every rank's measurements and
`decide` (a pure function) picks; it logs one line with the numbers and broadcasts the choice; every
rank then switches. When PowerSGD is not chosen, its state (error feedback: one copy of the gradients)
is freed.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState, powerSGD_hook

from trainer import dist as D
from trainer.metrics import CommTimer

OPTIONS = ("fp32", "bf16", "fp16", "powersgd")
# tried by --comm auto, from the most to the least exact; fp16 is left out: it sends the same bytes as
# bf16 (so it cannot be faster) and its narrow range can overflow large gradients.
AUTO_CANDIDATES = ("fp32", "bf16", "powersgd")
# a lossier option is chosen only when its median speed-up over a more exact one is above this floor and
# above the measured spread of that speed-up (max - min of the per-round ratios): noise buys no accuracy loss
AUTO_MARGIN = 0.05


class GradComm:
    """The gradient communication of one run: installs the hook, switches options, decides `auto`."""

    def __init__(self, cfg, world_size: int, timer: CommTimer, process_group=None, log=D.print0):
        self.requested = cfg.comm
        self.world_size = world_size
        self.timer = timer
        self.log = log
        self.tokens_per_step = cfg.tokens_per_rank_step * world_size
        self.current = "fp32" if cfg.comm == "auto" else cfg.comm
        self.installed = False
        self.psgd_settings = {"rank": cfg.powersgd_rank, "warm_start": cfg.powersgd_warm_start,
                              "start_step": cfg.powersgd_start_step}
        # only a run that may compress with PowerSGD holds its state (error feedback as large as the grads)
        self.psgd = (PowerSGDState(process_group=process_group, matrix_approximation_rank=cfg.powersgd_rank,
                                   start_powerSGD_iter=cfg.powersgd_start_step,
                                   warm_start=cfg.powersgd_warm_start, use_error_feedback=True,
                                   random_seed=cfg.seed)
                     if cfg.comm == "powersgd" or (cfg.comm == "auto" and world_size > 1) else None)
        self.process_group = process_group
        self._psgd_prev = None  # the previous bucket's PowerSGD future (see _hook)
        self.plan: list[str] = []
        self._round: list[int | None] = []  # the trial round of each planned step (None: not timed)
        self.decision: dict | None = None
        self._trial: list[dict] = []
        self._first = None  # first step of this process (0-based; > 0 after --resume)
        if cfg.comm == "auto" and world_size > 1:
            self.plan, self._round = trial_plan(max(1, cfg.timing_warmup_steps), cfg.auto_trial_steps)

    # --- the hook -----------------------------------------------------------------------------------
    def install(self, ddp_model) -> None:
        """Register the dispatcher on a DDP model (no-op on a bare model: world size 1)."""
        if hasattr(ddp_model, "register_comm_hook"):
            ddp_model.register_comm_hook(state=None, hook=self._hook)
            self.installed = True

    def _hook(self, state, bucket):
        buf = bucket.buffer()
        self.timer.launched(0)
        option = self.current
        if option == "powersgd":
            # torch's powerSGD_hook issues its P and Q all-reduces from future callbacks and blocks in
            # them (`.wait()`). With several buckets in flight on gloo, those callbacks occupy gloo's worker
            # threads and wait for collectives queued behind each other, and ranks may issue them in a
            # different order: the run hangs at the first compressed step (reproduced here with
            # --bucket-cap-mb 0.1). One bucket's chain at a time keeps the order of collectives the
            # same on every rank; the factors are small, so little overlap is lost.
            if self._psgd_prev is not None:
                self._psgd_prev.wait()
            before = self.psgd.total_numel_after_compression
            fut = powerSGD_hook(self.psgd, bucket)
            self._psgd_prev = fut
            sent = (self.psgd.total_numel_after_compression - before) or buf.numel()  # 0: plain warm-up
            nbytes = sent * buf.element_size()
        elif option in ("bf16", "fp16"):
            hook = default_hooks.bf16_compress_hook if option == "bf16" else default_hooks.fp16_compress_hook
            fut = hook(self.process_group, bucket)
            nbytes = buf.numel() * 2
        else:
            fut = default_hooks.allreduce_hook(self.process_group, bucket)
            nbytes = buf.numel() * buf.element_size()
        self.timer.add_bytes(nbytes)

        def finished(f):
            self.timer.done()
            return f.value()

        return fut.then(finished)

    # --- the schedule -------------------------------------------------------------------------------
    @property
    def timing_skip(self) -> int:
        """Steps of this process to leave out of the run's timing (the auto trial runs other options)."""
        return len(self.plan)

    def before_step(self, step: int) -> str:
        """Set the option for 0-based `step`; returns it (recorded in the step's metrics)."""
        if self._first is None:
            self._first = step
        i = step - self._first
        if self.decision is None and i < len(self.plan):
            self.current = self.plan[i]
            if self.current == "powersgd":  # compress from the first trial step (DDP's buckets are built)
                self.psgd.iter = max(self.psgd.iter, self.psgd.start_powerSGD_iter)
        return self.current

    def after_step(self, step: int, rec: dict) -> None:
        """Feed a finished step's metrics; at the end of the auto trial, decide (a collective)."""
        if not self.plan or self.decision is not None:
            return
        i = step - self._first
        if self._round[i] is not None:
            self._trial.append({"comm": self.current, "round": self._round[i], "dt_ms": rec["dt_ms"],
                                "compute_ms": rec["compute_ms"], "allreduce_ms": rec["allreduce_ms"],
                                "bytes": rec["allreduce_bytes"]})
        if i == len(self.plan) - 1:
            self._decide()

    def _decide(self) -> None:
        trials = D.all_gather_object(self._trial)
        decision = None
        if D.is_main_process():
            decision = decide(trials, self.tokens_per_step)
        self.decision = D.broadcast_object(decision)
        self.current = self.decision["choice"]
        if self.current != "powersgd" and self.psgd is not None:
            if self._psgd_prev is not None:
                self._psgd_prev.wait()
            self.psgd, self._psgd_prev = None, None  # its error feedback and factors go with it
        self.log("ddplab: comm auto: " + self.decision["why"])

    def summary(self) -> dict:
        out = {"comm": self.requested, "comm_chosen": self.current if self.installed else "none",
               "comm_auto": self.decision, "comm_timing_skip_steps": self.timing_skip}
        if "powersgd" in (self.requested, self.current) or self.plan:
            out["powersgd"] = dict(self.psgd_settings)
        return out


def trial_plan(warm: int, rounds: int) -> tuple[list[str], list[int | None]]:
    """The option of every step of the auto trial, and its round (None: not timed).

    `warm` fp32 steps, one untimed first step of each lossy candidate, then `rounds` rounds of one timed
    step per candidate, the order rotated by one each round."""
    plan = ["fp32"] * warm + list(AUTO_CANDIDATES[1:])
    rnd: list[int | None] = [None] * len(plan)
    n = len(AUTO_CANDIDATES)
    for r in range(rounds):
        plan += [AUTO_CANDIDATES[(r + k) % n] for k in range(n)]
        rnd += [r] * n
    return plan, rnd


def _median(v: list[float]) -> float:
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def decide(trials: list[list[dict]], tokens_per_step: int, margin: float = AUTO_MARGIN) -> dict:
    """Pick an option from every rank's timed trial steps (a pure function: same input, same choice).

    A step's time is the slowest rank's (ranks wait for each other in the all-reduce). Per option: the
    median step time over the rounds -> tokens/s; alpha = sum all-reduce ms / sum compute ms. A lossier
    option replaces the current pick only when, over the rounds both ran, its median speed-up (the
    pick's step time / its own, within each round) is above `margin` and above the spread of those
    per-round speed-ups (max - min): a gain the noise of the trial could explain buys no accuracy loss.
    """
    options = [c for c in AUTO_CANDIDATES if any(t["comm"] == c for t in trials[0])]
    step: dict[str, dict[int, float]] = {}  # option -> round -> slowest rank's step ms
    stats = {}
    for c in options:
        per_rank = [[t for t in rank if t["comm"] == c] for rank in trials]
        rounds = sorted(set.intersection(*({t["round"] for t in r} for r in per_rank)))
        step[c] = {k: max(t["dt_ms"] for r in per_rank for t in r if t["round"] == k) for k in rounds}
        comp = sum(t["compute_ms"] for r in per_rank for t in r)
        ar = sum(t["allreduce_ms"] for r in per_rank for t in r)
        n = sum(len(r) for r in per_rank)
        step_ms = _median(list(step[c].values()))
        stats[c] = {"tokens_per_sec": round(tokens_per_step / (step_ms / 1e3), 2),
                    "step_ms": round(step_ms, 1), "step_ms_min": round(min(step[c].values()), 1),
                    "step_ms_max": round(max(step[c].values()), 1),
                    "compute_ms": round(comp / n, 1), "allreduce_ms": round(ar / n, 1),
                    "alpha": round(ar / comp, 3) if comp > 0 else None,
                    "allreduce_bytes": per_rank[0][-1]["bytes"], "steps": len(step[c])}

    def gain(c: str, base: str) -> tuple[float, float]:
        """Median and spread (max - min) of base's step time / c's, round by round."""
        ratios = [step[base][k] / step[c][k] for k in step[c] if k in step[base]]
        return _median(ratios) - 1, max(ratios) - min(ratios)

    best, judged = options[0], {}
    for c in options[1:]:
        g, spread = gain(c, best)
        judged[c] = {"vs": best, "gain": round(g, 3), "spread": round(spread, 3)}
        if g > margin and g > spread:
            best = c
    base = stats.get("fp32", stats[best])["tokens_per_sec"]
    parts = [f"{c} {s['tokens_per_sec']:.1f} tok/s (step {s['step_ms']:.0f} [{s['step_ms_min']:.0f}-"
             f"{s['step_ms_max']:.0f}] ms over {s['steps']} rounds, compute {s['compute_ms']:.0f} ms, "
             f"all-reduce {s['allreduce_ms']:.0f} ms, alpha {s['alpha']}, "
             f"{s['allreduce_bytes'] / 1e6:.2f} MB/step)" for c, s in stats.items()]
    tests = [f"{c} vs {j['vs']} {j['gain']:+.1%} (spread {j['spread']:.1%})" for c, j in judged.items()]
    gain_best = stats[best]["tokens_per_sec"] / base
    why = (" | ".join(parts) + f" -> {best}: {gain_best:.2f}x the tokens/s of fp32 (" + "; ".join(tests) +
           f"; a lossier option must gain more than {margin:.0%} and more than the spread)")
    return {"choice": best, "options": stats, "margin": margin, "judged": judged,
            "speedup_vs_fp32": round(gain_best, 3), "why": why}
