"""Shards, manifest, verify, and the rank-strided, resumable loader."""

import hashlib
import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trainer.config import UsageError
from trainer.data.__main__ import main
from trainer.data.corpus import read_source, synthetic_docs
from trainer.data.loader import ShardLoader
from trainer.data.shards import manifest_digest, open_dataset, prepare, verify
from trainer.data.tokenizer import BOS, encode


def test_manifest_matches_the_contract(shards):
    m = json.loads((shards / "manifest.json").read_text())
    assert m["version"] == 1 and m["rows_per_group"] == 16
    assert [f["file"] for f in m["files"]] == [f"shard_{i:05d}.parquet" for i in range(4)]
    for f in m["files"]:
        p = shards / f["file"]
        assert hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"]
        meta = pq.ParquetFile(p).metadata
        assert (meta.num_rows, meta.num_row_groups) == (f["rows"], f["row_groups"]) == (128, 8)
        assert pq.read_schema(p).names == ["text"]
    lines = "".join(sorted(f"{f['file']} {f['sha256']}\n" for f in m["files"]))
    assert m["digest"] == hashlib.sha256(lines.encode()).hexdigest() == manifest_digest(m["files"])
    assert verify(shards) == []


def test_prepare_is_deterministic_and_idempotent(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    prepare(a, None, 100, 10, 4, seed=3)
    prepare(b, None, 100, 10, 4, seed=3)
    assert (a / "manifest.json").read_text() == (b / "manifest.json").read_text()
    assert prepare(a, None, 100, 10, 4, seed=3).startswith("unchanged")
    assert prepare(a, None, 100, 10, 4, seed=4).startswith("wrote")  # different data replaces it
    assert verify(a) == [] and sorted(p.name for p in a.iterdir())[-1] == "shard_00002.parquet"
    assert not list(tmp_path.glob(".*"))  # no temp folders left


def test_generated_corpus_is_english_like():
    docs = synthetic_docs(50, seed=1)
    assert docs == synthetic_docs(50, seed=1) and docs != synthetic_docs(50, seed=2)
    text = " ".join(docs)
    assert text.isascii() and text.count(" the ") > 50


def _stream_of(ds, rgs):
    out = []
    for i in rgs:
        fname, local = ds.row_groups[i]
        texts = pq.ParquetFile(ds.root / fname).read_row_group(local).column("text").to_pylist()
        out += [encode(t) for t in texts]
    return np.concatenate(out)


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_read_disjoint_row_groups_whose_union_is_everything(small_shards, world):
    ds = open_dataset(small_shards)
    n = len(ds.row_groups)
    seen = []
    for rank in range(world):
        ld = ShardLoader(ds, rank, world, batch_size=2, seq_len=16)
        got = []
        while ld.epoch == 0:
            x, y = ld.next_batch()
            assert torch_equal_shift(x, y)
            got.append(x.flatten().numpy())
        stream = np.concatenate(got)
        mine = list(range(rank, n, world))
        expected = _stream_of(ds, mine)
        # the batches are exactly this rank's row groups' tokens, in order (the tail wraps to epoch 1)
        assert np.array_equal(stream[: len(expected)], expected)
        assert sorted(ld.seen) == mine
        seen.append(set(mine))
    assert set().union(*seen) == set(range(n))
    assert sum(len(s) for s in seen) == n


def torch_equal_shift(x, y) -> bool:
    return bool((x.flatten()[1:] == y.flatten()[:-1]).all())


def test_loader_resumes_exactly_from_its_state(shards):
    ds = open_dataset(shards)
    a = ShardLoader(ds, 1, 2, batch_size=3, seq_len=50)
    for _ in range(7):
        a.next_batch()
    state = json.loads(json.dumps(a.state_dict()))  # survives a checkpoint
    b = ShardLoader(ds, 1, 2, batch_size=3, seq_len=50, state=state)
    for _ in range(5):
        xa, ya = a.next_batch()
        xb, yb = b.next_batch()
        assert (xa == xb).all() and (ya == yb).all()
    with pytest.raises(UsageError, match="same number of ranks"):
        ShardLoader(ds, 1, 3, 3, 50, state=state)


def test_world_size_larger_than_row_groups_is_refused(tmp_path):
    prepare(tmp_path / "d", None, 20, 10, 4, seed=0)
    ds = open_dataset(tmp_path / "d")
    with pytest.raises(UsageError, match="2 row groups but the world size is 3"):
        ShardLoader(ds, 0, 3, 1, 8)


def test_tokenizer_is_bytes_plus_bos():
    t = encode("hé")
    assert t.tolist() == [BOS, 104, 195, 169]


def test_source_folder_of_txt_jsonl_parquet(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("para one\n\npara two\n\n\n")
    (src / "b.jsonl").write_text('{"text": "json doc"}\n\n{"text": "second"}\n')
    pq.write_table(pa.table({"text": ["pq doc"], "other": [1]}), src / "c.parquet")
    assert sorted(read_source(src)) == sorted(["para one", "para two", "json doc", "second", "pq doc"])
    out = tmp_path / "out"
    assert "wrote 1 shards, 2 row groups" in prepare(out, src, None, 2, 16, seed=0)
    assert verify(out) == []


def test_source_parquet_without_text_and_bad_jsonl_are_named(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    pq.write_table(pa.table({"body": ["x"]}), src / "wrong.parquet")
    with pytest.raises(UsageError, match="wrong.parquet has no `text` column"):
        read_source(src)
    (src / "wrong.parquet").unlink()
    (src / "bad.jsonl").write_text('{"text": "ok"}\n{"txt": "no"}\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2"):
        read_source(src)


def test_prepare_refuses_a_foreign_nonempty_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not a shard folder"):
        prepare(tmp_path, None, 40, 10, 4, seed=0)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_verify_cli_names_corrupt_missing_and_stray_files(shards, tmp_path, capsys):
    d = tmp_path / "copy"
    shutil.copytree(shards, d)
    assert main(["verify", str(d)]) == 0
    raw = bytearray((d / "shard_00001.parquet").read_bytes())
    raw[100] ^= 0xFF
    (d / "shard_00001.parquet").write_bytes(bytes(raw))
    (d / "shard_00002.parquet").unlink()
    shutil.copy(d / "shard_00000.parquet", d / "shard_00099.parquet")
    capsys.readouterr()
    assert main(["verify", str(d)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("ddplab: error: 3 problem(s)")
    assert "shard_00001.parquet is corrupt" in err
    assert "shard_00002.parquet is missing" in err
    assert "shard_00099.parquet is not listed" in err
