"""trainer/checkpoint.py on a full or failing disk: no temp file left behind, no good checkpoint dropped."""

from __future__ import annotations

import errno
import os

import pytest

from trainer import checkpoint


def test_a_failed_write_removes_its_temp_file(tmp_path, monkeypatch):
    checkpoint.save_bytes(tmp_path, 1, b"good")

    def full_disk(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        checkpoint.save_bytes(tmp_path, 2, b"x" * 4096)
    left = sorted(p.name for p in checkpoint.ckpt_dir(tmp_path).iterdir())
    assert left == ["step_000001.pt", "step_000001.pt.sha256"]  # no .tmp-<pid> file


def test_older_checkpoints_stay_until_the_new_one_reads_back_whole(tmp_path, monkeypatch):
    checkpoint.save_bytes(tmp_path, 1, b"good", keep=1)
    real = checkpoint.atomic_write

    def torn(path, data):  # the disk keeps only half of the model file
        real(path, data[: len(data) // 2] if path.suffix == ".pt" else data)

    monkeypatch.setattr(checkpoint, "atomic_write", torn)
    with pytest.raises(OSError, match="sha256 differs"):
        checkpoint.save_bytes(tmp_path, 2, b"newer state", keep=1)
    steps = [s for s, _ in checkpoint.list_checkpoints(tmp_path)]
    assert 1 in steps  # the last good checkpoint was not dropped
    monkeypatch.setattr(checkpoint, "atomic_write", real)
    checkpoint.save_bytes(tmp_path, 3, b"newest", keep=1)
    assert [s for s, _ in checkpoint.list_checkpoints(tmp_path)] == [3]
