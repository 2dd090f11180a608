"""The stat cache of nodeprobe/hashing.py: a file is re-read only when its stat changed."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nodeprobe import hashing

REPO = Path(__file__).resolve().parents[2]
BIG = hashing.CACHE_MIN_BYTES


@pytest.fixture
def cache(tmp_path, monkeypatch):
    path = tmp_path / "cache.json"
    monkeypatch.setenv("DDPLAB_HASH_CACHE", str(path))
    monkeypatch.setattr(hashing, "_cache", None)
    monkeypatch.setattr(hashing, "_cache_dirty", False)
    monkeypatch.setattr(hashing, "RACY_S", 0.3)  # ctime cannot be set back: the tests wait the window out
    return path


def old_file(path: Path, data: bytes) -> Path:
    """A file whose mtime and ctime are past the racy window (ctime cannot be set: wait it out)."""
    path.write_bytes(data)
    past = time.time() - 60
    os.utime(path, (past, past))
    return path


def wait_racy_window():
    time.sleep(hashing.RACY_S + 0.1)


def test_an_unchanged_file_is_not_read_again(cache, tmp_path, monkeypatch):
    f = old_file(tmp_path / "shard.bin", b"a" * BIG)
    wait_racy_window()
    want = hashlib.sha256(b"a" * BIG).hexdigest()
    assert hashing.sha256_file(f) == want
    hashing.flush_cache()
    assert json.loads(cache.read_text())[str(f)][5] == want
    # a new process (fresh module state) trusts the entry: prove it by making reads fail
    monkeypatch.setattr(hashing, "_cache", None)
    real_open = open

    def no_reads(p, mode="r", *a, **k):
        if "b" in mode and str(p) == str(f):
            raise AssertionError("the file was read although its stat did not change")
        return real_open(p, mode, *a, **k)

    monkeypatch.setattr("builtins.open", no_reads)
    assert hashing.sha256_file(f) == want


def test_a_changed_file_is_read_again_even_with_the_same_size_and_mtime(cache, tmp_path):
    f = old_file(tmp_path / "shard.bin", b"a" * BIG)
    wait_racy_window()
    hashing.sha256_file(f)
    st = f.stat()
    f.write_bytes(b"b" * BIG)  # same size; put the old mtime back: only ctime tells
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert hashing.sha256_file(f) == hashlib.sha256(b"b" * BIG).hexdigest()


def test_a_file_written_just_now_is_not_cached(cache, tmp_path):
    f = tmp_path / "fresh.bin"
    f.write_bytes(b"c" * BIG)
    hashing.sha256_file(f)
    assert str(f) not in hashing._load_cache()


def test_small_files_and_use_cache_false_bypass_the_cache(cache, tmp_path):
    small = old_file(tmp_path / "small.py", b"x" * 100)
    big = old_file(tmp_path / "big.bin", b"y" * BIG)
    wait_racy_window()
    hashing.sha256_file(small)
    hashing.sha256_file(big, use_cache=False)
    assert hashing._load_cache() == {}


def test_zero_turns_it_off_and_a_corrupt_cache_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setattr(hashing, "_cache", None)
    monkeypatch.setenv("DDPLAB_HASH_CACHE", "0")
    assert hashing.cache_path() is None
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    monkeypatch.setenv("DDPLAB_HASH_CACHE", str(bad))
    f = old_file(tmp_path / "d.bin", b"d" * BIG)
    assert hashing.sha256_file(f) == hashlib.sha256(b"d" * BIG).hexdigest()


def test_the_shipped_alone_program_writes_its_cache_at_exit(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    old_file(tree / "big.bin", b"e" * BIG)
    (tree / hashing.SYNC_RECORD).write_text('["big.bin"]')  # a node hashes what ddplab placed
    wait_racy_window()
    cache = tmp_path / "c.json"
    env = {**os.environ, "DDPLAB_HASH_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-", "tree-lines", str(tree)], input=(REPO / "nodeprobe" /
                         "hashing.py").read_text(), capture_output=True, text=True, env=env, check=True)
    assert out.stdout.split()[0] == hashlib.sha256(b"e" * BIG).hexdigest()
    assert str((tree / "big.bin").resolve()) in json.loads(cache.read_text())
