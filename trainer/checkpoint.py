"""Checkpoints: rank 0 writes, atomically, with a checksum; resume reads on rank 0 only.

`OUT/ckpt/step_{N:06d}.pt` is a plain `torch.save` file (model, optimizer, step, every rank's data
position and RNG state, config). It is written to a temp file, fsynced and renamed; then its sha256 goes
to `step_{N:06d}.pt.sha256` the same way. A checkpoint counts only when its sha256 file exists and
matches, so a torn or truncated file is detected and the previous one is used. Other ranks never read
these files: train.py broadcasts what rank 0 loaded (no shared storage is assumed).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
from pathlib import Path

import torch

_NAME = re.compile(r"^step_(\d{6,})\.pt$")


def ckpt_dir(out: str | Path) -> Path:
    return Path(out) / "ckpt"


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes to `path` via a temp file + fsync + rename, then fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
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
    d = ckpt_dir(out)
    d.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    path = d / f"step_{step:06d}.pt"
    atomic_write(path, data)
    atomic_write(path.with_name(path.name + ".sha256"), (hashlib.sha256(data).hexdigest() + "\n").encode())
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
