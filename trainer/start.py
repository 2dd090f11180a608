"""Before the first step: what every rank checks and agrees on (``Start``, ``agree_on_start``), and what the
run trains with, built the same way on every rank (``Parts``, ``build``). trainer/train.py runs the loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trainer import dist as D
from trainer import elastic, shard
from trainer.agreement import agree, setup_checks
from trainer.balance import ShareController
from trainer.config import TrainConfig, UsageError
from trainer.data.heldout import ValBatches
from trainer.data.loader import ShardLoader
from trainer.data.shards import Dataset
from trainer.data.shared_stream import SharedStreamLoader
from trainer.data.tokenizer import VOCAB_SIZE
from trainer.device import setup_threads
from trainer.evaluate import Evaluator
from trainer.launch_contract import new_run_id
from trainer.local_sgd import LocalSGD
from trainer.model import GPT, GPTConfig, param_count
from trainer.optim import lr_ratio_at, make_adamw
from trainer.peak import measure_peak_flops

# every rank's host and address, gathered at start: a rank that loses a peer names it (trainer/train.py main)
PEERS: list[dict] = []


@dataclass
class Start:
    """What every rank checked and agreed on before anything is written."""
    di: D.DistInfo
    device: torch.device
    threads: int
    ds: Dataset  # the training set (without the held-out row groups)
    val: ValBatches | None  # None: no validation
    hosts: list[str]  # by rank
    peaks: list[float]  # every rank's measured fp32 GEMM FLOP/s, for MFU
    dtype: str  # the autocast dtype every rank uses, and why
    why: str
    run_id: str


@dataclass
class Parts:
    """What the run trains with, built the same way on every rank."""
    gcfg: GPTConfig
    raw: GPT  # the bare model (DDP wraps it later; checkpoints and checksums use this one; --shard shards it)
    opt: torch.optim.Optimizer
    loader: ShardLoader | SharedStreamLoader
    shares: ShareController  # each rank's sequences per step (--balance moves them)
    lsgd: LocalSGD | None  # --sync-every H > 1: the outer loop of local SGD / DiLoCo
    evaluator: Evaluator
    tokens_per_step: int  # global
    shard_timer: shard.ShardTimer | None = None  # --shard: FSDP2's all-gathers and reduce-scatters


def agree_on_start(cfg: TrainConfig) -> Start:
    """Join the process group; every rank checks its own input and all see all results (exit 2 or 3 on
    a problem anywhere) before anything is written."""
    if cfg.device == "cuda" and not torch.cuda.is_available():  # the only CUDA query, and only for cuda
        raise UsageError("--device cuda but torch sees no CUDA device; ddplab trains on --device cpu")
    di = D.init_distributed(cfg.device, D.first_step_timeout(cfg.pg_timeout_s, cfg.compile))
    device = torch.device("cuda", di.local_rank) if cfg.device == "cuda" else torch.device("cpu")
    threads = setup_threads(cfg.threads, di.local_world_size)
    cfg.resolve(di.world_size)  # --global-batch-tokens -> --grad-accum for this world size
    if cfg.shard and di.world_size < 2:
        raise UsageError("--shard splits the model over the ranks of a distributed run; start it under "
                         "torchrun with 2 or more ranks, or drop --shard")
    mine, ds, val = setup_checks(cfg, di)
    mine["peak_flops"] = measure_peak_flops()  # this rank's fp32 GEMM FLOP/s, at its thread count: for MFU
    statuses = D.all_gather_object(mine)
    agree(statuses)  # raises unless every rank opened the same data set
    PEERS[:] = [{"rank": s["rank"], "host": s["host"], "addr": s["addr"]} for s in statuses]
    dtype, why = statuses[di.rank]["dtype"], statuses[di.rank]["why"]
    if len({s["dtype"] for s in statuses}) > 1:  # auto chose bf16 on some nodes only: all use fp32
        dtype, why = "fp32", "auto: not every node has bf16 units"
    run_id = D.broadcast_object(cfg.run_id or new_run_id())
    return Start(di, device, threads, ds, val, [s["host"] for s in statuses],
                 [s["peak_flops"] for s in statuses], dtype, why, run_id)


def build(cfg: TrainConfig, start: Start) -> Parts:
    """Model, optimizer, data loader and the mode's helpers, before any checkpoint is loaded."""
    di, ds = start.di, start.ds
    gcfg = GPTConfig(vocab_size=VOCAB_SIZE, seq_len=cfg.seq_len, n_layer=cfg.depth, n_embd=cfg.n_embd,
                     n_head=cfg.n_head)
    torch.manual_seed(cfg.seed)
    raw = GPT(gcfg).to(start.device)
    n_params = sum(p.numel() for p in raw.parameters())
    assert n_params == param_count(gcfg), "param_count() is out of date with the model"
    shard_timer = shard.ShardTimer() if cfg.shard else None
    if cfg.shard:  # before the optimizer: it holds the shards (DTensors), not the full parameters
        if cfg.shard_return_memory:
            shard.return_freed_memory()
        shard.shard_model(raw, cfg.reshard_after_forward, shard_timer)
    opt = make_adamw([p for p in raw.parameters() if p.dim() >= 2], cfg.lr, cfg.weight_decay)
    shares = ShareController(cfg.batch_size * cfg.grad_accum * di.world_size, di.world_size,
                             cfg.balance_every, cfg.balance_damping)
    if cfg.elastic or cfg.shard:  # one global position, valid at any world size (a sharded resume may have
        # another number of ranks)
        loader = elastic.UniformStream(ds, di.rank, di.world_size, cfg.batch_size, cfg.seq_len)
    elif cfg.balance:
        loader = SharedStreamLoader(ds, di.rank, cfg.seq_len)
    else:
        loader = ShardLoader(ds, di.rank, di.world_size, cfg.batch_size, cfg.seq_len)
    lsgd = (LocalSGD(raw.parameters(), cfg.sync_every, cfg.steps, cfg.outer_lr, cfg.outer_momentum,
                     wire=cfg.comm, overlap=cfg.sync_overlap, per_step_until=cfg.sync_every_after,
                     fragments=cfg.sync_fragments, schedule=cfg.sync_schedule,
                     lr_ratio=lambda step: lr_ratio_at(cfg, step))
            if cfg.sync_every > 1 else None)  # low-communication mode: H local steps, then one sync
    evaluator = Evaluator(start.val, cfg.eval_every_tokens, di.rank, di.world_size, lockstep=cfg.shard)
    return Parts(gcfg, raw, opt, loader, shares, lsgd, evaluator, cfg.tokens_per_rank_step * di.world_size,
                 shard_timer)
