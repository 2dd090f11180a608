"""Every setting of a training run: a typed dataclass, validated, with kebab-case CLI flags.

`TrainConfig` is the single source of truth: `python -m trainer --help` (trainer/cli.py) is generated from its
fields (the help text is the comment in `FIELD_HELP`), and the resolved config is written as
`config.json` next to every run and inside every checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from trainer import straggler_rule
from trainer.launch_contract import PG_TIMEOUT_S, RUN_ID_DOC, is_run_id

# Gradient communication options (trainer/comm.py): torch's DDP comm hooks, or auto (measure, then choose).
# int8/int4 only with --sync-every > 1 (trainer/quant_wire.py): DDP has no such gradient hook.
COMM_CHOICES = ("fp32", "bf16", "fp16", "powersgd", "auto", "int8", "int4")
QUANTIZED = ("int8", "int4")
DTYPE_CHOICES = ("auto", "fp32", "bf16")
DEVICE_CHOICES = ("cpu", "cuda")
SYNC_SCHEDULE_CHOICES = ("constant", "inverse-lr", "qsr")  # trainer/sync_schedule.py


class UsageError(ValueError):
    """Bad input from the user (flags, data, checkpoint): exit 2 with one line, no traceback."""


@dataclass
class TrainConfig:
    # --- where things are -----------------------------------------------------------------------
    data: str = ""
    out: str = ""
    run_id: str = ""
    # --- model ----------------------------------------------------------------------------------
    depth: int = 2
    n_embd: int = 0
    n_head: int = 0
    seq_len: int = 128
    # --- optimisation ---------------------------------------------------------------------------
    steps: int = 50
    batch_size: int = 8
    grad_accum: int = 1
    global_batch_tokens: int = 0
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    lr_warmup_steps: int = 5
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 1337
    # --- validation (trainer/evaluate.py) ----------------------------------------------------------
    val_row_groups: int = -1
    eval_every_tokens: int = 0
    eval_batches: int = 8
    # --- checkpoints, checks, logging -------------------------------------------------------------
    ckpt_every: int = 0
    ckpt_keep: int = 3
    resume: bool = False
    check_every: int = 50
    log_every: int = 1
    timing_warmup_steps: int = 2
    # --- hardware and communication ---------------------------------------------------------------
    device: str = "cpu"
    threads: int = 0
    dtype: str = "auto"
    allow_bf16: bool = False
    force_dtype: bool = False
    compile: bool = False
    comm: str = "fp32"
    bucket_cap_mb: float = 25.0
    powersgd_rank: int = 4
    powersgd_start_step: int = 10
    powersgd_warm_start: bool = True
    auto_trial_steps: int = 3
    pg_timeout_s: float = float(PG_TIMEOUT_S)
    straggler_every: int = 20
    straggler_ratio: float = straggler_rule.RATIO
    balance: bool = False
    balance_every: int = 10
    balance_damping: float = 0.5
    # --- low-communication mode (trainer/local_sgd.py) ----------------------------------------------
    sync_every: int = 1
    sync_every_after: int = 0
    allow_local_sgd: bool = False
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    sync_overlap: bool = False
    sync_fragments: int = 1
    sync_schedule: str = "constant"
    # --- elastic runs (trainer/elastic.py) ---------------------------------------------------------------
    elastic: bool = False
    # --- sharded training (trainer/shard.py) ---------------------------------------------------------------
    shard: bool = False
    reshard_after_forward: bool = True
    shard_return_memory: bool = True
    # filled in by __post_init__ when left at 0 (derived from depth)
    _derived: list = field(default_factory=list, repr=False)

    def __post_init__(self):
        def need(cond, msg):
            if not cond:
                raise UsageError(msg)

        need(self.data != "", "--data is required: a folder made by `python -m trainer.data prepare`")
        need(self.out != "", "--out is required: the folder for metrics, summary and checkpoints")
        need(1 <= self.depth <= 64, f"--depth must be in 1..64, got {self.depth}")
        if self.n_embd == 0:
            self.n_embd = self.depth * 64
            self._derived.append("n_embd")
        if self.n_head == 0:
            self.n_head = max(1, self.n_embd // 64)
            self._derived.append("n_head")
        need(self.n_embd > 0, f"--n-embd must be positive, got {self.n_embd}")
        need(self.n_head > 0, f"--n-head must be positive, got {self.n_head}")
        need(self.n_embd % self.n_head == 0,
             f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}; "
             f"choose a width that is a multiple of the head count")
        need((self.n_embd // self.n_head) % 2 == 0,
             f"head size {self.n_embd // self.n_head} (n_embd/n_head) must be even for rotary embeddings")
        need(self.seq_len >= 2, f"--seq-len must be at least 2, got {self.seq_len}")
        need(self.steps >= 1, f"--steps must be at least 1, got {self.steps}")
        need(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        need(self.grad_accum >= 1, f"--grad-accum must be at least 1, got {self.grad_accum}")
        need(self.global_batch_tokens >= 0,
             f"--global-batch-tokens must be >= 0 (0: --grad-accum sets it), got {self.global_batch_tokens}")
        if self.global_batch_tokens:
            need(self.grad_accum == 1, f"--grad-accum {self.grad_accum} with --global-batch-tokens "
                 f"{self.global_batch_tokens}: the global batch sets the accumulation; give one of the two")
            grad_accum_for(self, 1)  # the world-size-free part: a multiple of batch-size x seq-len
        need(self.val_row_groups >= -1,
             f"--val-row-groups must be >= -1 (-1: auto, 0: off), got {self.val_row_groups}")
        need(self.eval_every_tokens >= 0,
             f"--eval-every-tokens must be >= 0 (0: only at the end), got {self.eval_every_tokens}")
        need(self.eval_batches >= 1, f"--eval-batches must be at least 1, got {self.eval_batches}")
        need(self.lr > 0, f"--lr must be positive, got {self.lr}")
        need(0.0 <= self.min_lr_frac <= 1.0, f"--min-lr-frac must be in [0, 1], got {self.min_lr_frac}")
        need(self.lr_warmup_steps >= 0, "--lr-warmup-steps must be >= 0")
        need(self.weight_decay >= 0, "--weight-decay must be >= 0")
        need(self.grad_clip >= 0, "--grad-clip must be >= 0 (0 disables clipping)")
        need(self.ckpt_every >= 0, "--ckpt-every must be >= 0 (0: only the final checkpoint)")
        need(self.ckpt_keep >= 1, "--ckpt-keep must be >= 1")
        need(self.check_every >= 0, "--check-every must be >= 0 (0: only at the end)")
        need(self.log_every >= 1, "--log-every must be >= 1")
        need(self.timing_warmup_steps >= 0, "--timing-warmup-steps must be >= 0")
        need(self.device in DEVICE_CHOICES, f"--device must be one of {DEVICE_CHOICES}, got {self.device!r}")
        need(self.threads >= 0, "--threads must be >= 0 (0: cores available / local ranks)")
        need(self.dtype in DTYPE_CHOICES, f"--dtype must be one of {DTYPE_CHOICES}, got {self.dtype!r}")
        need(self.comm in COMM_CHOICES, f"--comm must be one of {COMM_CHOICES}, got {self.comm!r}")
        need(self.bucket_cap_mb > 0, "--bucket-cap-mb must be positive")
        need(self.powersgd_rank >= 1, f"--powersgd-rank must be at least 1, got {self.powersgd_rank}")
        need(self.powersgd_start_step >= 2, f"--powersgd-start-step must be at least 2 (torch's PowerSGD "
             f"needs a plain step while DDP builds its buckets), got {self.powersgd_start_step}")
        need(self.auto_trial_steps >= 3, f"--auto-trial-steps must be at least 3 (a median and a spread "
             f"per option), got {self.auto_trial_steps}")
        need(self.straggler_every >= 0, "--straggler-every must be >= 0 (0: no straggler check)")
        need(self.straggler_ratio > 1, f"--straggler-ratio must be above 1, got {self.straggler_ratio}")
        need(self.balance_every >= 1, f"--balance-every must be at least 1, got {self.balance_every}")
        need(0 < self.balance_damping <= 1,
             f"--balance-damping must be in (0, 1], got {self.balance_damping}")
        need(self.sync_every >= 1, f"--sync-every must be at least 1, got {self.sync_every}")
        need(self.outer_lr > 0, f"--outer-lr must be positive, got {self.outer_lr}")
        need(0 <= self.outer_momentum < 1, f"--outer-momentum must be in [0, 1), got {self.outer_momentum}")
        need(self.sync_every_after >= 0, f"--sync-every-after must be >= 0, got {self.sync_every_after}")
        need(not self.sync_every_after or self.sync_every > 1,
             "--sync-every-after N runs N per-step steps before the local steps of --sync-every H; add "
             "--sync-every H (H > 1) and --allow-local-sgd, or drop --sync-every-after")
        need(self.sync_every_after < self.steps,
             f"--sync-every-after {self.sync_every_after} leaves no local steps in --steps {self.steps}; "
             f"use fewer warm-up steps or --sync-every 1")
        need(self.comm not in QUANTIZED or self.sync_every > 1,
             f"--comm {self.comm} sends the outer gradient of --sync-every H (H > 1) in low-bit codes; DDP's "
             f"per-step gradients have no such hook: add --sync-every H and --allow-local-sgd, or use "
             f"--comm bf16")
        need(self.sync_fragments >= 1, f"--sync-fragments must be at least 1, got {self.sync_fragments}")
        need(self.sync_fragments == 1 or (self.sync_every > 1 and self.sync_every % self.sync_fragments == 0),
             f"--sync-fragments {self.sync_fragments} syncs one fragment every H/F steps of --sync-every H; "
             f"use an H > 1 that {self.sync_fragments} divides (e.g. --sync-every "
             f"{self.sync_fragments * max(2, -(-self.sync_every // self.sync_fragments))}), or drop "
             f"--sync-fragments")
        need(self.sync_schedule in SYNC_SCHEDULE_CHOICES and (self.sync_schedule == "constant" or
                                                               self.sync_every > 1),
             f"--sync-schedule {self.sync_schedule} (one of {', '.join(SYNC_SCHEDULE_CHOICES)}) places the "
             f"syncs of --sync-every H; add --sync-every H (H > 1) and --allow-local-sgd, or drop "
             f"--sync-schedule")
        need(not self.sync_overlap or self.sync_every > 1,
             "--sync-overlap hides the sync of the low-communication mode behind the next steps; add "
             "--sync-every H (H > 1) and --allow-local-sgd, or drop --sync-overlap")
        if self.shard:
            self._check_shard(need)
        if self.sync_every > 1:
            need(self.allow_local_sgd,
                 f"--sync-every {self.sync_every} changes the optimization (local SGD: each rank takes "
                 f"{self.sync_every} steps on its own data, then the ranks average); add --allow-local-sgd "
                 f"to accept that, or use --sync-every 1 (all-reduce gradients every step)")
            need(self.comm in ("fp32", "bf16", "fp16", *QUANTIZED),
                 f"--comm {self.comm} with --sync-every {self.sync_every}: local SGD all-reduces no "
                 f"gradients, only the parameter change at each sync; use --comm fp32 (the default), or "
                 f"bf16/fp16 to send that change in 16 bits, int8/int4 in 8/4")
            need(not (self.sync_overlap and self.comm in QUANTIZED),
                 f"--sync-overlap with --comm {self.comm}: an overlapped sync all-reduces in fp32/bf16/fp16 "
                 f"only; drop --sync-overlap or use --comm bf16")
            need(not self.balance,
                 f"--balance with --sync-every {self.sync_every}: balancing weights each rank's share of "
                 f"one all-reduced gradient, local SGD has none; use one of the two")
        if self.elastic:
            self._check_elastic(need)
        for flag, on in (("--no-reshard-after-forward", self.reshard_after_forward),
                         ("--no-shard-return-memory", self.shard_return_memory)):
            need(self.shard or on, f"{flag} sets how --shard keeps its gathered parameters; add --shard or "
                 f"drop {flag}")
        need(self.pg_timeout_s >= 5, f"--pg-timeout-s must be at least 5 seconds, got {self.pg_timeout_s}")
        # "" = generated on rank 0; else a run id as the launcher's (trainer/launch_contract.py)
        need(not self.run_id or is_run_id(self.run_id),
             f"--run-id must be {RUN_ID_DOC}, got {self.run_id!r}")

    def _check_elastic(self, need) -> None:
        need(not self.balance, "--elastic with --balance: an elastic group re-forms with any node count, the "
             "shares are measured per node; use one of the two")
        need(self.sync_every == 1, f"--elastic with --sync-every {self.sync_every}: local SGD keeps per-rank "
             f"optimizer state that cannot move to another world size; use --sync-every 1")

    def _check_shard(self, need) -> None:
        # FSDP2 reduce-scatters every gradient itself: DDP's comm hooks, per-rank shares of one all-reduced
        # gradient, local SGD's per-rank parameters and the elastic re-formation have nothing to act on
        clash = [flag for flag, on in (("--balance", self.balance),
                                       (f"--sync-every {self.sync_every}", self.sync_every > 1),
                                       ("--elastic", self.elastic),
                                       (f"--comm {self.comm}", self.comm != "fp32"),
                                       ("--compile", self.compile)) if on]
        need(not clash, f"--shard with {', '.join(clash)}: sharded training (FSDP2) all-gathers parameters "
             f"and reduce-scatters fp32 gradients every step and cannot combine with "
             f"{'it' if len(clash) == 1 else 'them'}; drop {' '.join(clash)} or --shard")

    def resolve(self, world_size: int) -> None:
        """Settings that depend on the world size: --global-batch-tokens sets --grad-accum (again at every
        elastic re-formation, as the world size changes)."""
        if self.global_batch_tokens:
            self.grad_accum = grad_accum_for(self, world_size)

    @property
    def tokens_per_rank_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("_derived")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def grad_accum_for(cfg: TrainConfig, world_size: int) -> int:
    """--global-batch-tokens G as micro-steps per optimizer step: G / (batch-size x seq-len x world), as
    nanoGPT does, so one node and N nodes take the same optimizer steps on the same number of tokens."""
    per = cfg.batch_size * cfg.seq_len * world_size
    g = cfg.global_batch_tokens
    if g % per == 0:
        return g // per
    lo, hi = (g // per) * per, (g // per + 1) * per
    near = f"{hi} (--grad-accum {hi // per})"
    near = f"{lo} (--grad-accum {lo // per}) or {near}" if lo else near
    where = f" x world size {world_size}" if world_size > 1 else ""
    hint = (" (--elastic: a multiple of batch-size x seq-len x every group size the run may have)"
            if cfg.elastic else "")
    raise UsageError(f"--global-batch-tokens {g} is not a multiple of --batch-size {cfg.batch_size} x "
                     f"--seq-len {cfg.seq_len}{where} = {per} tokens; nearest valid: {near}{hint}")


# One help line per field: this is the documentation of each setting.
FIELD_HELP = {
    "data": "folder of parquet shards + manifest.json (made by `python -m trainer.data prepare`)",
    "out": "output folder: config.json, metrics.rank{R}.jsonl, summary*.json, ckpt/",
    "run_id": "name of this run, recorded in the summary (default: generated on rank 0)",
    "depth": "number of transformer blocks; also sets the width (64 per block) when --n-embd is 0",
    "n_embd": "model width; 0 = depth*64",
    "n_head": "attention heads; 0 = n_embd/64 (at least 1)",
    "seq_len": "tokens (bytes) per training sequence",
    "steps": "optimizer steps in the whole run (also sets the learning-rate schedule)",
    "batch_size": "sequences per rank per micro-step",
    "grad_accum": "micro-steps per optimizer step (gradients sync only on the last, via no_sync)",
    "global_batch_tokens": "tokens per optimizer step over all ranks; sets --grad-accum = G / (batch-size x "
                           "seq-len x world size), so any node count takes the same steps (0: --grad-accum)",
    "lr": "peak learning rate (AdamW)",
    "min_lr_frac": "cosine decay ends at lr*min_lr_frac",
    "lr_warmup_steps": "linear learning-rate warm-up steps",
    "weight_decay": "AdamW weight decay on matrices",
    "grad_clip": "clip the global gradient norm to this (0: off)",
    "seed": "random seed (model init); the same seed gives the same losses",
    "val_row_groups": "hold out the last N row groups of the data set (manifest order) for the validation "
                      "loss; no training loader reads them (-1: auto, 1 in 16 row groups; 0: no validation)",
    "eval_every_tokens": "evaluate the validation loss each time the run's global token count crosses a "
                         "multiple of this (0: only at the end); with --sync-every > 1 at the next sync",
    "eval_batches": "validation batches (of --batch-size sequences) in the fixed validation set, split "
                    "over the ranks",
    "ckpt_every": "write a checkpoint every N steps on rank 0 (0: only the final one)",
    "ckpt_keep": "keep the newest N checkpoints",
    "resume": "continue from the newest valid checkpoint in OUT/ckpt (rank 0 reads, broadcasts)",
    "check_every": "compare a parameter checksum across ranks every N steps (0: only at the end)",
    "log_every": "print a progress line every N steps (rank 0)",
    "timing_warmup_steps": "first steps of this process left out of tokens/s and timing percentiles",
    "device": "training device; ddplab trains on cpu (cuda uses nccl)",
    "threads": "torch intra-op threads per rank (0: cores available / ranks on this node)",
    "dtype": "compute dtype: auto (fp32 unless the CPU has bf16 units and --allow-bf16), fp32, bf16",
    "allow_bf16": "let --dtype auto choose bf16 autocast when the CPU has avx512_bf16/amx",
    "force_dtype": "accept --dtype bf16 even when the CPU has no bf16 units (slow)",
    "compile": "torch.compile the model (slow first step on CPU)",
    "comm": "how gradients travel: fp32 = DDP's all-reduce; bf16/fp16 = 16-bit compressed all-reduce (half "
            "the bytes); powersgd = low-rank PowerSGD; auto = try fp32, bf16, powersgd in the first steps "
            "and keep the one with the most tokens/s; with --sync-every > 1: the dtype of each sync "
            "(fp32, bf16, fp16; int8/int4 = 8/4-bit codes with a scale per 128 values, all-gathered: "
            "3.9x/7.5x fewer bytes than fp32)",
    "bucket_cap_mb": "DDP gradient bucket size in MiB",
    "powersgd_rank": "PowerSGD rank r: a n x m gradient travels as (n+m)*r numbers",
    "powersgd_start_step": "plain all-reduce for the first N steps before PowerSGD compresses (min 2)",
    "powersgd_warm_start": "PowerSGD reuses last step's factors (--no-powersgd-warm-start: new random ones)",
    "auto_trial_steps": "--comm auto: timed trial rounds (>= 3), one step per option each, order rotated",
    "pg_timeout_s": "process-group timeout: a rank waiting longer for a peer fails (naming it) instead of "
                    "hanging",
    "straggler_every": "every N steps the ranks compare their compute time; a slow rank gets a warning "
                       "(0: off)",
    "straggler_ratio": "warn when a rank's compute time is this many times the others' median",
    "balance": "give each rank a share of the global batch (world x batch-size x grad-accum sequences) "
               "that follows its measured speed, so a slower node does not hold every step back",
    "balance_every": "--balance: re-estimate the shares every N steps",
    "balance_damping": "--balance: move the shares this fraction of the way toward the measured split (1: "
                       "all the way; lower: steadier)",
    "sync_every": "low-communication mode: all-reduce every step (1) or, with H > 1, let each rank take H "
                  "optimizer steps on its own data, then average the parameter change (local SGD / DiLoCo); "
                  "needs --allow-local-sgd",
    "sync_every_after": "--sync-every > 1: all-reduce gradients every step (DDP) for the first N steps, then "
                        "take --sync-every H local steps per sync (post-local SGD; the warm-up's bytes count "
                        "in the run's bytes per step)",
    "allow_local_sgd": "accept --sync-every > 1, which changes the optimization (and its loss)",
    "outer_lr": "--sync-every > 1: outer learning rate on the averaged parameter change (1 with "
                "--outer-momentum 0: plain parameter averaging)",
    "outer_momentum": "--sync-every > 1: outer Nesterov momentum (DiLoCo: 0.9; 0: plain SGD outer step)",
    "sync_overlap": "--sync-every > 1: do not wait for a sync; its all-reduce runs during the next H steps "
                    "and is applied one sync late, keeping each rank's progress made meanwhile (the ranks "
                    "agree only at checks, checkpoints, evaluations and the end)",
    "sync_fragments": "--sync-every H: sync the parameters in F fragments of consecutive tensors, one every "
                      "H/F steps in turn, so each syncs every H steps and a sync moves 1/F of the bytes "
                      "(Streaming DiLoCo); with --sync-overlap each lands at the next fragment's turn",
    "sync_schedule": "--sync-every H: when the syncs fall: constant (every H steps), inverse-lr (every H x "
                     "peak/lr steps, lr at the period's start) or qsr (H x (peak/lr)^2, the Quadratic "
                     "Synchronization Rule): fewer syncs as the learning rate decays",
    "elastic": "run under torchrun's elastic agent: every node keeps a copy of the checkpoints in its own "
               "--out, each (re)start resumes from the newest copy any node holds, the data position is "
               "one shared stream valid at any world size; OUT/membership.jsonl logs each group",
    "shard": "sharded training (FSDP2): each rank holds 1/N of the parameters, gradients and AdamW moments "
             "(per transformer block and the root), all-gathers a block's parameters to use them and "
             "reduce-scatters its gradients; checkpoints in torch.distributed.checkpoint format that "
             "resume on any number of ranks",
    "reshard_after_forward": "--shard: free a block's gathered parameters after its forward and gather them "
                             "again for backward (--no-reshard-after-forward: keep them, one all-gather "
                             "less per step, more memory)",
    "shard_return_memory": "--shard: give the gathered parameters and full gradients back to the system "
                           "each time they are freed (a lower peak RSS; --no-shard-return-memory: glibc "
                           "keeps them for reuse, faster, a peak RSS near DDP's: docs/shard.md)",
}
