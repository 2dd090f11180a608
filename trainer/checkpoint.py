"""Checkpoints: rank 0 writes, atomically, with a checksum; resume reads on rank 0 and broadcasts.

`OUT/ckpt/step_{N:06d}.pt` is a plain `torch.save` file (model, optimizer, step, every rank's data
position and RNG state, config; with --sync-every > 1 also every rank's inner optimizer state and the
outer optimizer's, written right after a parameter sync). It is written to a temp file, fsynced and
renamed; then its sha256 goes to `step_{N:06d}.pt.sha256` the same way. A checkpoint counts only when
its sha256 file exists and matches, so a torn or truncated file is detected and the previous one is
used. Other ranks never read these files: train.py broadcasts what rank 0 loaded (no shared storage
is assumed). With --elastic the local rank 0 of every node writes the same checkpoint into its own
OUT/ckpt, and trainer/elastic.py picks the newest copy any node holds.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nodeprobe.hashing import sha256_file
from trainer import dist as D
from trainer.config import TrainConfig, UsageError
from trainer.local_sgd import crossed

if TYPE_CHECKING:
    from trainer.start import Parts

_NAME = re.compile(r"^step_(\d{6,})\.pt$")
# settings that must match between a checkpoint and the run that resumes it
# (val_row_groups: the training stream is the row groups before the held-out ones)
_RESUME_MUST_MATCH = ("depth", "n_embd", "n_head", "seq_len", "batch_size", "grad_accum", "steps", "balance",
                      "sync_every", "elastic", "global_batch_tokens", "val_row_groups")
# settings added later: what a checkpoint written before them meant
_OLD_DEFAULTS = {"balance": False, "sync_every": 1, "elastic": False, "global_batch_tokens": 0,
                 "val_row_groups": 0}


def ckpt_dir(out: str | Path) -> Path:
    return Path(out) / "ckpt"


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes to `path` via a temp file + fsync + rename, then fsync the folder. A write that fails
    (a full disk) removes its temp file and raises."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    d = ckpt_dir(out)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name))]
    return sorted(found)


def save(out: str | Path, step: int, state: dict, keep: int = 3) -> Path:
    """Rank 0 only. Writes step_N.pt and its .sha256; keeps the newest `keep` checkpoints."""
    buf = io.BytesIO()
    torch.save(state, buf)
    # the serialized state once in memory (getvalue() would copy it: another 12 bytes a parameter on rank 0)
    return save_bytes(out, step, buf.getbuffer(), keep)


def save_bytes(out: str | Path, step: int, data: bytes | memoryview, keep: int = 3) -> Path:
    """Write an already serialized checkpoint (--elastic: the copy a node received from a peer)."""
    d = ckpt_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"step_{step:06d}.pt"
    digest = hashlib.sha256(data).hexdigest()
    atomic_write(path, data)
    atomic_write(path.with_name(path.name + ".sha256"), (digest + "\n").encode())
    # Older checkpoints go only once this one reads back whole: a torn write never costs the last good one.
    # read in pieces (not the whole checkpoint in memory beside the one just written), never from a cache
    if sha256_file(path, use_cache=False) != digest:
        raise OSError(f"{path}: its sha256 differs after the write; the older checkpoints are kept")
    for _, old in list_checkpoints(out)[:-keep]:
        old.unlink(missing_ok=True)
        old.with_name(old.name + ".sha256").unlink(missing_ok=True)
    return path


def load_latest(out: str | Path) -> tuple[dict | None, Path | None, list[str]]:
    """The newest checkpoint whose checksum matches: (state, path, warnings about skipped files)."""
    warnings = []
    for _, path in reversed(list_checkpoints(out)):
        sha_file = path.with_name(path.name + ".sha256")
        if not sha_file.exists():
            warnings.append(f"skipping {path}: no {sha_file.name} (the write did not finish)")
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != sha_file.read_text().strip():
            warnings.append(f"skipping {path}: sha256 mismatch (torn or corrupt file)")
            continue
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as e:  # a matching checksum but unloadable: still skip, say why
            warnings.append(f"skipping {path}: cannot be loaded ({type(e).__name__}: {e})")
            continue
        return state, path, warnings
    return None, None, warnings


def load_for_resume(cfg: TrainConfig, data_digest: str, world_size: int):
    """Rank 0 reads the newest valid checkpoint; every rank gets it (or an error) by broadcast."""
    payload = None
    if D.is_main_process():
        state, path, warnings = load_latest(cfg.out)
        for w in warnings:
            print(f"ddplab: warning: {w}", file=sys.stderr, flush=True)
        if state is None and any(ckpt_dir(cfg.out).glob("step_*.dcp")):
            payload = {"error": f"{ckpt_dir(cfg.out)} holds sharded checkpoints (step_N.dcp, written with "
                                f"--shard); add --shard to resume them"}
        elif state is None:
            payload = {"none": True}
        else:
            problem = resume_problem(state, path, cfg, data_digest, world_size)
            if problem:
                payload = {"error": problem}
            else:
                payload = state
                payload["path"] = str(path)
    payload = D.broadcast_state(payload)
    if "error" in payload:
        raise UsageError(payload["error"])
    return None if payload.get("none") else payload


def resume_problem(state: dict, path, cfg: TrainConfig, data_digest: str,
                   world_size: int | None) -> str | None:
    """Why `state` cannot be resumed by this run, or None. world_size None: any (--elastic re-maps it)."""
    old = state["config"]
    # --global-batch-tokens: --grad-accum follows the world size (an elastic group may differ)
    keys = [k for k in _RESUME_MUST_MATCH if not (k == "grad_accum" and cfg.global_batch_tokens)]
    bad = [k for k in keys if old.get(k, _OLD_DEFAULTS.get(k)) != getattr(cfg, k)]
    if bad:
        return (f"checkpoint {path} was written with " + ", ".join(
            f"--{k.replace('_', '-')} {old.get(k)}" for k in bad) + "; this run asks for " +
            ", ".join(f"{getattr(cfg, k)}" for k in bad) + "; resume with the same settings")
    if state["data_digest"] != data_digest:
        return (f"checkpoint {path} was trained on data digest {state['data_digest'][:12]}, --data has "
                f"{data_digest[:12]}; resume on the same shards")
    if world_size is not None and state["world_size"] != world_size:
        return (f"checkpoint {path} was written by {state['world_size']} ranks, this run has {world_size}; "
                f"resume with the same number of ranks")
    return None


# ---- the run's side: when to write, what to write, what to restore -------------------------------------

def is_due(cfg: TrainConfig, last_sync: int, done: int) -> bool:
    """A checkpoint follows the step `done` (1-based, right after a sync; the last sync was after
    `last_sync`): a multiple of --ckpt-every was crossed since, or the run ends."""
    return done == cfg.steps or crossed(cfg.ckpt_every, last_sync, done)


def save_run(cfg: TrainConfig, parts: Parts, done: int, facts: dict, is_writer: bool) -> None:
    """Every rank (the positions and RNG states are gathered): write the run's state after step `done`;
    `facts` are the run's (run id, world size, data digest, loss_first, tokens_seen)."""
    positions = D.all_gather_object(parts.loader.state_dict())
    rngs = D.all_gather_object(torch.get_rng_state())
    extra = parts.lsgd.checkpoint_fields(parts.opt) if parts.lsgd else {}
    if cfg.elastic:  # one global data position and one RNG state, valid at any world size
        positions, rngs = positions[:1], rngs[:1]
    if is_writer:
        save(cfg.out, done, {
            "step": done, "model": parts.raw.state_dict(), "optim": parts.opt.state_dict(), "data": positions,
            "rng": rngs, "balance": parts.shares.state_dict(), "config": cfg.to_dict(), **facts,
            "val": parts.evaluator.state_dict(), **extra}, keep=cfg.ckpt_keep)


def restore(state: dict, cfg: TrainConfig, parts: Parts, rank: int) -> None:
    """Load a resumed checkpoint into the run's parts; a checkpoint written with other settings is one
    UsageError naming it."""
    one = 0 if cfg.elastic else rank  # elastic checkpoints hold one data position and one RNG state
    parts.raw.load_state_dict(state["model"])
    parts.opt.load_state_dict(state["optim_ranks"][rank] if parts.lsgd else state["optim"])
    try:
        if parts.lsgd:
            parts.lsgd.load_state_dict(state["local_sgd"])
        parts.loader.load_state_dict(state["data"][one])
        if cfg.balance:
            parts.shares.load_state_dict(state["balance"])
    except (ValueError, KeyError) as e:
        raise UsageError(f"checkpoint {state['path']}: {e}; resume with the settings it was "
                         f"written with") from None
    torch.set_rng_state(state["rng"][one])
    parts.evaluator.load_state_dict(state.get("val"))
