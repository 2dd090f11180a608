"""bench/stdlib_corpus.py: the standard library as a corpus, read by the trainer's own `prepare --source`."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.lowcomm import describe_corpus, shard_stats  # noqa: E402
from bench.stdlib_corpus import (  # noqa: E402
    CHUNK_BYTES,
    SKIP_DIRS,
    SOURCE_FILE,
    chunks,
    stdlib_files,
    stdlib_root,
    write_source,
)

CAP = 400_000  # ~200 documents: a few seconds to prepare


def test_only_library_files_are_kept_in_sorted_order_within_the_cap(tmp_path):
    for rel in ["b.py", "a/z.py", "a/test_x.py", "test/t.py", "json/tests/t.py", "site-packages/p.py",
                "idlelib/i.py", "encodings/cp.py", "config-3.11-x86_64-linux-gnu/c.py",
                "_sysconfigdata__linux.py", "a/notes.txt", "c.py"]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * 10)  # 60 bytes each
    kept = [p.relative_to(tmp_path).as_posix() for p in stdlib_files(tmp_path, 10_000)]
    assert kept == ["a/z.py", "b.py", "c.py"]
    assert [p.name for p in stdlib_files(tmp_path, 179)] == ["z.py", "b.py"]  # the third would pass 179


def test_the_real_library_is_cut_the_same_way_every_time_and_honours_the_cap(tmp_path):
    root = stdlib_root()
    files = stdlib_files(root, CAP)
    sizes = [p.stat().st_size for p in files]
    assert files and sum(sizes) <= CAP
    following = stdlib_files(root, 10 * CAP)
    assert following[:len(files)] == files and sum(sizes) + following[len(files)].stat().st_size > CAP
    assert not any(set(p.relative_to(root).parts) & SKIP_DIRS or p.name.startswith("test_")
                   for p in following)
    a, b = write_source(tmp_path / "a", root, CAP), write_source(tmp_path / "b", root, CAP)
    assert (tmp_path / "a" / SOURCE_FILE).read_bytes() == (tmp_path / "b" / SOURCE_FILE).read_bytes()
    docs = [json.loads(ln)["text"] for ln in (tmp_path / "a" / SOURCE_FILE).read_text().splitlines()]
    assert a == b and (a["files"], a["source_bytes"], a["documents"]) == (len(files), sum(sizes), len(docs))
    assert docs[0] == chunks(files[0].read_text(encoding="utf-8"), CHUNK_BYTES)[0]


def test_chunks_end_at_line_ends_and_lose_nothing_but_a_blank_tail():
    text = "".join(f"line {i} " + "x" * (i % 50) + "\n" for i in range(500))
    pieces = chunks(text, 1000)
    assert "".join(pieces) == text and all(p.endswith("\n") for p in pieces)
    assert all(len(p) >= 1000 for p in pieces[:-1]) and len(pieces) > 10
    assert chunks("x" * 999 + "\n" + "\n \n", 1000) == ["x" * 999 + "\n"]


def test_the_trainers_prepare_reads_the_documents_and_the_study_reports_them(tmp_path):
    info = write_source(tmp_path / "src", stdlib_root(), CAP)
    out = tmp_path / "shards"
    r = subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--source", str(tmp_path / "src"),
                        "--out", str(out), "--rows-per-group", "8"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    v = subprocess.run([sys.executable, "-m", "trainer.data", "verify", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and v.stdout.startswith("ok:"), v.stderr
    docs = [json.loads(ln)["text"] for ln in (tmp_path / "src" / SOURCE_FILE).read_text().splitlines()]
    shards = [t for f in sorted(out.glob("shard_*.parquet"))
              for t in pq.read_table(f).column("text").to_pylist()]
    assert len(shards) == len(docs) - len(docs) % 8 == info["documents"] - info["documents"] % 8
    assert set(shards) <= set(docs) and shards != docs[:len(shards)]  # shuffled, every row a document
    s = shard_stats(out)
    assert (s["documents"], s["row_groups"], s["val_row_groups"]) == (len(shards), len(shards) // 8,
                                                                      len(shards) // 8 // 16)
    assert s["bytes"] == sum(len(t.encode()) for t in shards)
    bos = s["documents"] - 8 * s["val_row_groups"]  # one per training document
    assert sum(s["train_tokens_per_rank"]) + s["val_bytes"] == s["bytes"] + bos
    line = describe_corpus({"name": "stdlib", "label": "the stdlib", "source": info} | s, 10_000)
    assert f"{info['files']:,} files" in line and f"{len(shards):,} documents" in line
    assert "no token twice" in line and "some more than once" in describe_corpus({"label": "x"} | s, 10**7)
