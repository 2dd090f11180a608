"""Ranks agree before and during training: same input at the start, same parameters after steps.

At the start every rank checks its own input (data, dtype, output folder) and all ranks see all the
results before anything is written; a rank whose data differs is named (exit 3). During the run the
ranks compare a checksum of their parameters; DDP keeps them byte-identical, so a difference means the
ranks no longer train one model (exit 3). With --shard each rank holds other parameters (its shards): the
checksum is over the all-gathered whole, so the ranks agree on what they jointly hold, and it equals the
checksum of the same model unsharded (a checkpoint loaded on one process).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from trainer import checkpoint, checkpoint_dcp
from trainer import dist as D
from trainer.config import TrainConfig, UsageError
from trainer.data import heldout
from trainer.data.heldout import ValBatches
from trainer.data.loader import ShardLoader
from trainer.data.shards import Dataset, open_dataset
from trainer.device import cpu_has_bf16, resolve_dtype
from trainer.local_sgd import crossed


def param_sha256(model: torch.nn.Module) -> str:
    """sha256 over every parameter's name and bytes. A sharded parameter (--shard: a DTensor) is all-gathered
    first, one at a time, so every rank hashes the whole model and the checksum is the one the unsharded
    model would have (every rank must call it then)."""
    for unit in model.modules():  # FSDP2 swaps gathered plain tensors in for the DTensors until it reshards
        if isinstance(unit, FSDPModule):  # (the root after forward); numpy() would pin their storage
            unit.reshard()
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        full = p.detach().full_tensor() if isinstance(p, DTensor) else p.detach()
        h.update(name.encode())
        h.update(full.cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def params_already_agree(model) -> bool:
    """Before DDP: do all ranks hold the same parameters? They do when the same seed initialized the same
    model (or all loaded one checkpoint); then DDP's start-up broadcast of the whole model (512 MB for 128M
    parameters: ~4 s at 1 Gbit/s, ~43 s at 100 Mbit/s) is skipped for a 64-byte exchange of checksums.
    A CPU whose random-number kernels differ (torch picks vectorized paths per CPU) gets rank 0's
    parameters by DDP's broadcast, as before."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return True
    shas = D.all_gather_object(param_sha256(model))
    agree = all(s == shas[0] for s in shas)
    if not agree:
        D.print0("ddplab: the ranks' initial parameters differ (another CPU's random-number kernel?); "
                 "rank 0's are broadcast to all")
    return agree


def check_params_agree(model, step: int, hosts: list[str]) -> str:
    """All ranks compare a checksum of their parameters; a mismatch names the ranks (exit 3)."""
    mine = param_sha256(model)
    shas = D.all_gather_object(mine)
    bad = [r for r, s in enumerate(shas) if s != shas[0]]
    if bad:
        who = ", ".join(f"rank {r} on {hosts[r]} sha256 {shas[r][:12]}" for r in bad)
        raise D.RanksDisagree(f"parameters differ after step {step}: rank 0 on {hosts[0]} sha256 "
                              f"{shas[0][:12]} vs {who}; the ranks no longer train one model (check that "
                              f"every node runs the same ddplab and torch version)")
    return mine


def check_is_due(cfg: TrainConfig, last_sync: int, done: int) -> bool:
    """A parameter checksum follows the step `done` (right after a sync; the last was after `last_sync`):
    a multiple of --check-every was crossed since, or the run ends."""
    return done == cfg.steps or crossed(cfg.check_every, last_sync, done)


def setup_checks(cfg: TrainConfig, di: D.DistInfo) -> tuple[dict, Dataset | None, ValBatches | None]:
    """Everything that can go wrong with this rank's input, as a status every rank will see, the opened
    training set (None on an error; without the held-out row groups) and the validation batches (None:
    no validation). Opening the set hashes every shard: done once per start, here."""
    ds = val = None
    st = {"rank": di.rank, "host": D.hostname(), "addr": D.node_address(), "error": None,
          "bf16_units": cpu_has_bf16() if cfg.device == "cpu" else None}
    try:
        st["dtype"], st["why"] = resolve_dtype(cfg)
        ds = open_dataset(cfg.data)
        st["digest"], st["files"] = ds.digest, ds.files
        ds, held = heldout.split(ds, cfg.val_row_groups)
        if held is not None:
            val = heldout.ValBatches(held, cfg.batch_size, cfg.seq_len, cfg.eval_batches)
        try:
            ShardLoader(ds, di.rank, di.world_size, cfg.batch_size, cfg.seq_len)  # world size vs row groups
        except UsageError as e:
            if held is None:
                raise
            raise UsageError(f"{e}; {len(held.row_groups)} more are held out for validation "
                             f"(--val-row-groups)") from None
        out = Path(cfg.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out} exists and is not a folder; choose another path")
        if di.rank == 0 and not (cfg.resume or cfg.elastic) and (checkpoint.list_checkpoints(out) or
                                                                  checkpoint_dcp.list_checkpoints(out)):
            raise UsageError(f"--out {out} already holds checkpoints of an earlier run; add --resume to "
                             f"continue it, or choose a new --out")
    except UsageError as e:
        st["error"] = str(e)
    return st, ds, val


def agree(statuses: list[dict]) -> None:
    failed = [s for s in statuses if s["error"]]
    if failed:
        if len(statuses) == 1:
            raise UsageError(failed[0]["error"])
        by_msg: dict[str, list[str]] = {}
        for s in failed:
            by_msg.setdefault(s["error"], []).append(f"rank {s['rank']} on {s['host']}")
        raise UsageError("; ".join(f"{', '.join(who)}: {msg}" for msg, who in by_msg.items()))
    ref = statuses[0]
    diff = [s for s in statuses if s["digest"] != ref["digest"]]
    if diff:
        parts = []
        for s in diff:
            a, b = ref["files"], s["files"]
            changed = sorted(f for f in set(a) & set(b) if a[f] != b[f])
            only0, only_r = sorted(set(a) - set(b)), sorted(set(b) - set(a))
            what = "; ".join(x for x in (
                f"differing files: {', '.join(changed[:5])}" if changed else "",
                f"only on rank 0: {', '.join(only0[:5])}" if only0 else "",
                f"only on rank {s['rank']}: {', '.join(only_r[:5])}" if only_r else "") if x)
            parts.append(f"rank {s['rank']} on {s['host']} has data digest {s['digest'][:12]} "
                         f"({len(b)} files), rank 0 on {ref['host']} has {ref['digest'][:12]} "
                         f"({len(a)} files)"
                         f"{': ' + what if what else ''}")
        raise D.RanksDisagree("ranks would train on different data: " + " | ".join(parts) +
                              "; fix: run the same `python -m trainer.data prepare` on every node or copy "
                              "the master's shard folder")
