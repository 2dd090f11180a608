"""--shard checkpoints: torch.distributed.checkpoint (DCP) folders that resume on any number of ranks.

`OUT/ckpt/step_{N:06d}.dcp/` holds a DCP checkpoint of the model and the AdamW state (`.metadata` and one
`__R_0.distcp` file of shards per rank that wrote it), `run.pt` (the rest of the run's state: step, config,
the one global data position, rank 0's RNG state, the validation curve, the run's facts) and
`MANIFEST.sha256` (every other file's sha256, written last). A checkpoint counts only when its manifest
exists and every file matches it, so a torn write falls back to the previous one.

No shared storage is assumed: each rank writes its shards into a folder of its own
(`.step_N.dcp.tmp-rank{R}`) and sends the file to rank 0 in 16 MiB pieces; rank 0 assembles the whole
checkpoint in its own OUT/ckpt and renames it into place; the others remove their folder. On resume rank 0
checks the newest checkpoint and sends its files to every rank the same way (each keeps a copy in
`.resume.tmp-rank{R}` until loaded); DCP then reads, on each rank, the parts of the old shards its new
shards cover, whatever the world size that wrote them (2 -> 3 ranks). The data position is one global
shared-stream position (as --elastic's), valid at any world size.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from nodeprobe.hashing import sha256_file
from trainer import checkpoint
from trainer import dist as D
from trainer.config import TrainConfig, UsageError

if TYPE_CHECKING:
    from trainer.start import Parts

_NAME = re.compile(r"^step_(\d{6,})\.dcp$")
MANIFEST = "MANIFEST.sha256"
RUN_STATE = "run.pt"
# files travel between ranks in pieces of this size: a rank never holds a whole shard file (the point of
# sharding is that no node holds the model's state) on top of its shards
CHUNK_BYTES = 16 << 20


def list_checkpoints(out: str | Path) -> list[tuple[int, Path]]:
    d = checkpoint.ckpt_dir(out)
    if not d.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in d.iterdir() if (m := _NAME.match(p.name)) and p.is_dir())


def manifest_problem(path: Path) -> str | None:
    """Why the checkpoint folder `path` is not whole (None: every file matches its manifest)."""
    man = path / MANIFEST
    if not man.exists():
        return f"no {MANIFEST} (the write did not finish)"
    for line in man.read_text().splitlines():
        digest, name = line.split("  ", 1)
        f = path / name
        if not f.is_file() or sha256_file(f, use_cache=False) != digest:
            return f"{name} is missing or its sha256 differs (torn or corrupt)"
    return None


def _write_manifest(folder: Path) -> None:
    lines = [f"{sha256_file(f, use_cache=False)}  {f.name}"
             for f in sorted(folder.iterdir()) if f.is_file() and f.name != MANIFEST]
    checkpoint.atomic_write(folder / MANIFEST, ("\n".join(lines) + "\n").encode())


def _fresh(folder: Path) -> Path:
    """An empty folder of this run's own naming (a leftover of an interrupted write is this run's too)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return folder


def save_run(cfg: TrainConfig, parts: Parts, done: int, facts: dict) -> Path | None:
    """Every rank: write the sharded checkpoint after step `done`; rank 0 ends up holding all of it."""
    di = D.info()
    root = checkpoint.ckpt_dir(cfg.out)
    stage = _fresh(root / f".step_{done:06d}.dcp.tmp-rank{di.rank}")
    msd, osd = get_state_dict(parts.raw, parts.opt)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=stage)
    if di.rank == 0:
        buf = io.BytesIO()
        torch.save({"step": done, "config": cfg.to_dict(), "data": [parts.loader.state_dict()],
                    "rng": [torch.get_rng_state()], "val": parts.evaluator.state_dict(), **facts}, buf)
        checkpoint.atomic_write(stage / RUN_STATE, buf.getvalue())
    files = D.all_gather_object(sorted(f.name for f in stage.iterdir() if f.is_file()))
    for src in range(1, di.world_size):  # every other rank's shard file(s) to rank 0
        for name in files[src]:
            if di.rank in (0, src):
                _send_file(stage / name, src)
    final = None
    if di.rank == 0:
        _write_manifest(stage)
        final = root / f"step_{done:06d}.dcp"
        if final.exists():  # a checkpoint of this step from an earlier attempt, replaced whole
            shutil.rmtree(final)
        stage.rename(final)
        for _, old in list_checkpoints(cfg.out)[:-cfg.ckpt_keep]:
            shutil.rmtree(old)
    else:
        shutil.rmtree(stage)
    D.barrier()
    return final


def load_for_resume(cfg: TrainConfig, data_digest: str) -> dict | None:
    """Every rank: the run state of the newest whole checkpoint (rank 0 reads, checks, broadcasts), with
    "folder" set to where this rank holds a copy of its files (see `restore`); None: none to resume."""
    payload = None
    if D.is_main_process():
        payload = {"none": True}
        for _, path in reversed(list_checkpoints(cfg.out)):
            problem = manifest_problem(path)
            if problem:
                print(f"ddplab: warning: skipping {path}: {problem}", file=sys.stderr, flush=True)
                continue
            state = torch.load(path / RUN_STATE, map_location="cpu", weights_only=True)
            problem = checkpoint.resume_problem(state, path, cfg, data_digest, world_size=None)
            payload = {"error": problem} if problem else state | {"path": str(path)}
            break
        if payload.get("none") and checkpoint.list_checkpoints(cfg.out):
            payload = {"error": f"{checkpoint.ckpt_dir(cfg.out)} holds checkpoints of a run without --shard "
                                f"(step_N.pt); resume them without --shard"}
    payload = D.broadcast_state(payload)
    if "error" in payload:
        raise UsageError(payload["error"])
    if payload.get("none"):
        return None
    payload["folder"] = _copy_from_rank0(cfg, Path(payload["path"]))
    return payload


def _copy_from_rank0(cfg: TrainConfig, path: Path) -> Path:
    """Rank 0's checkpoint files on every rank: rank 0 reads its own folder, the others get a copy."""
    rank = D.info().rank
    names = D.broadcast_object(sorted(f.name for f in path.iterdir() if f.is_file()) if rank == 0 else None)
    folder = path if rank == 0 else _fresh(checkpoint.ckpt_dir(cfg.out) / f".resume.tmp-rank{rank}")
    for name in names:
        _broadcast_file(path / name if rank == 0 else folder / name)
    return folder


def _chunks(size: int) -> list[int]:
    """The sizes of the pieces a file of `size` bytes travels in."""
    return [min(CHUNK_BYTES, size - at) for at in range(0, size, CHUNK_BYTES)]


def _send_file(path: Path, src: int) -> None:
    """Rank `src`'s file `path` to rank 0's `path` (in its own folder), in pieces; only the two call it."""
    sending = D.info().rank == src
    size = torch.tensor([path.stat().st_size if sending else 0], dtype=torch.int64)
    if sending:
        dist.send(size, dst=0)
    else:
        dist.recv(size, src=src)
    with open(path, "rb" if sending else "wb") as f:
        for n in _chunks(int(size.item())):
            buf = torch.empty(n, dtype=torch.uint8)
            if sending:
                f.readinto(buf.numpy())
                dist.send(buf, dst=0)
            else:
                dist.recv(buf, src=src)
                f.write(buf.numpy())
        if not sending:
            f.flush()
            os.fsync(f.fileno())


def _broadcast_file(path: Path) -> None:
    """Rank 0's file to every rank, in pieces: rank 0 reads `path`, the others write theirs."""
    root = D.info().rank == 0
    size = torch.tensor([path.stat().st_size if root else 0], dtype=torch.int64)
    dist.broadcast(size, src=0)
    with open(path, "rb" if root else "wb") as f:
        for n in _chunks(int(size.item())):
            buf = torch.empty(n, dtype=torch.uint8)
            if root:
                f.readinto(buf.numpy())
            dist.broadcast(buf, src=0)
            if not root:
                f.write(buf.numpy())


def restore(state: dict, parts: Parts) -> None:
    """Every rank: load the model's and optimizer's shards for this world size, then the run's state."""
    folder = Path(state["folder"])
    msd, osd = get_state_dict(parts.raw, parts.opt)
    sd = {"model": msd, "optim": osd}
    dcp.load(sd, checkpoint_id=folder)
    set_state_dict(parts.raw, parts.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    try:
        parts.loader.load_state_dict(state["data"][0])
    except (ValueError, KeyError) as e:
        raise UsageError(f"checkpoint {state['path']}: {e}; resume with the settings it was written "
                         f"with") from None
    torch.set_rng_state(state["rng"][0])
    parts.evaluator.load_state_dict(state.get("val"))
    if D.info().rank != 0:
        shutil.rmtree(folder)
