"""nodeprobe/compile_seed.py on real files: the seed holds the smoke ranks' plain files (not their precompiled
headers or locks) as the same bytes every time, 0600; a node unpacks it into each local rank's folder only
when its sha256 is the control host's, never replacing what a rank compiled itself, and refuses a tar that
holds a link or a name leaving the folder (a rogue producer cannot write outside the ranks' folders)."""

from __future__ import annotations

import _ctypes
import hashlib
import io
import json
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from nodeprobe import compile_seed
from nodeprobe.compile_seed import SeedRefused

KERNEL = Path(_ctypes.__file__).read_bytes()  # a real, whole shared library


def smoke_ranks(cache):
    for rank, extra in ((0, "a"), (1, "b")):
        folder = cache / f"smoke-rank{rank}"
        (folder / "ab").mkdir(parents=True)
        (folder / "ab" / "cab.main.so").write_bytes(KERNEL)
        (folder / "fxgraph" / "x6").mkdir(parents=True)
        (folder / "fxgraph" / "x6" / f"entry-{extra}").write_bytes(extra.encode())
        (folder / "tmp" / "torchinductor_root").mkdir(parents=True)
        (folder / "tmp" / "torchinductor_root" / "big.h.gch").write_bytes(b"x" * 100)
        (folder / "locks").mkdir()
        (folder / "locks" / "l.lock").write_bytes(b"")


def test_pack_takes_the_smoke_ranks_plain_files_as_the_same_bytes_0600(tmp_path):
    cache = tmp_path / "compile-cache"
    smoke_ranks(cache)
    first = compile_seed.pack({"compile_cache": str(cache)})
    again = compile_seed.pack({"compile_cache": str(cache)})
    assert first["sha256"] == again["sha256"] and first["files"] == 3
    assert stat.S_IMODE((cache / "seed.tar").stat().st_mode) == 0o600
    with tarfile.open(cache / "seed.tar") as tar:
        assert sorted(tar.getnames()) == ["ab/cab.main.so", "fxgraph/x6/entry-a", "fxgraph/x6/entry-b"]
    assert first["fingerprint"]["torch"] and first["fingerprint"]["python"]


def test_nothing_compiled_packs_nothing(tmp_path):
    assert compile_seed.pack({"compile_cache": str(tmp_path / "none")})["files"] == 0


def test_unpack_fills_each_local_ranks_folder_and_keeps_what_a_rank_compiled(tmp_path):
    cache = tmp_path / "compile-cache"
    smoke_ranks(cache)
    packed = compile_seed.pack({"compile_cache": str(cache)})
    (cache / "local1" / "ab").mkdir(parents=True)
    (cache / "local1" / "ab" / "cab.main.so").write_bytes(b"its own")
    out = compile_seed.unpack({"compile_cache": str(cache), "sha256": packed["sha256"], "ranks": 2})
    assert (out["placed"], out["kept"]) == (5, 1)
    assert (cache / "local0" / "ab" / "cab.main.so").read_bytes() == KERNEL
    assert (cache / "local1" / "ab" / "cab.main.so").read_bytes() == b"its own"
    assert stat.S_IMODE((cache / "local0" / "fxgraph").stat().st_mode) == 0o700
    assert stat.S_IMODE((cache / "local0" / "fxgraph" / "x6" / "entry-a").stat().st_mode) == 0o600


def crafted(cache, member: tarfile.TarInfo, data: bytes = b"") -> str:
    cache.mkdir(parents=True, exist_ok=True)
    with tarfile.open(cache / "seed.tar", "w") as tar:
        tar.addfile(member, io.BytesIO(data) if data else None)
    return hashlib.sha256((cache / "seed.tar").read_bytes()).hexdigest()  # as the control host's stat


def test_a_seed_that_is_not_the_control_hosts_is_refused_and_nothing_is_unpacked(tmp_path):
    cache = tmp_path / "compile-cache"
    smoke_ranks(cache)
    compile_seed.pack({"compile_cache": str(cache)})
    with pytest.raises(SeedRefused, match="not the master's"):
        compile_seed.unpack({"compile_cache": str(cache), "sha256": "0" * 64, "ranks": 1})
    assert not (cache / "local0").exists()


@pytest.mark.parametrize(("name", "kind", "said"), [
    ("../../.bashrc", tarfile.REGTYPE, "not a plain relative name"),
    ("/root/.bashrc", tarfile.REGTYPE, "not a plain relative name"),
    ("ab/link.so", tarfile.SYMTYPE, "not a plain file"),
    ("ab/hard.so", tarfile.LNKTYPE, "not a plain file"),
])
def test_a_seed_with_a_link_or_a_name_out_of_the_folder_is_refused_whole(tmp_path, name, kind, said):
    cache = tmp_path / "lab" / "compile-cache"
    member = tarfile.TarInfo(name)
    member.type = kind
    data = b"evil" if kind == tarfile.REGTYPE else b""
    member.size = len(data)
    if kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        member.linkname = "/root/.ssh/authorized_keys"
    digest = crafted(cache, member, data)
    with pytest.raises(SeedRefused, match=said):
        compile_seed.unpack({"compile_cache": str(cache), "sha256": digest, "ranks": 1})
    assert not (cache / "local0").exists()
    assert sorted(p.name for p in (tmp_path / "lab").rglob("*")) == ["compile-cache", "seed.tar"]


def test_the_verb_prints_one_line_and_exits_1_on_a_refused_seed(tmp_path):
    cache = tmp_path / "compile-cache"
    smoke_ranks(cache)
    compile_seed.pack({"compile_cache": str(cache)})
    proc = subprocess.run([sys.executable, "-m", "nodeprobe", "compile-seed", "unpack"],
                          input=json.dumps({"compile_cache": str(cache), "sha256": "f" * 64}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "not the master's" in json.loads(proc.stdout)["error"]


def test_a_half_written_library_is_left_out_of_the_seed(tmp_path):
    """A compile killed mid-way (a smoke run or a tune layout at its time limit) leaves a truncated .so in the
    folder; shipped, every node's rank would fail on it ("file too short"). A whole one travels."""
    cache = tmp_path / "compile-cache"
    folder = cache / "smoke-rank0" / "ab"
    folder.mkdir(parents=True)
    (folder / "cwhole.main.so").write_bytes(KERNEL)
    (folder / "chalf.main.so").write_bytes(KERNEL[: len(KERNEL) // 2])
    compile_seed.pack({"compile_cache": str(cache)})
    with tarfile.open(cache / "seed.tar") as tar:
        assert tar.getnames() == ["ab/cwhole.main.so"]
