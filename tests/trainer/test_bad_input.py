"""Each bad input: exit 2, one `ddplab: error:` line naming the thing and the fix, no traceback, and the
out dir is not created."""

import json
import re
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from nodeprobe.hashing import sha256_file
from tests.helpers.trainer_runs import TINY, error_lines, torchrun, trainer
from trainer.data.shards import manifest_digest, prepare
from trainer.device import cpu_has_bf16


def _copy(shards, tmp_path):
    d = tmp_path / "data"
    shutil.copytree(shards, d)
    return d


def _no_text(shards, tmp_path):
    d = _copy(shards, tmp_path)
    f = d / "shard_00001.parquet"
    pq.write_table(pa.table({"body": ["x"] * 128}), f, row_group_size=16)
    m = json.loads((d / "manifest.json").read_text())
    m["files"][1]["sha256"] = sha256_file(f)
    m["digest"] = manifest_digest(m["files"])
    (d / "manifest.json").write_text(json.dumps(m))
    return d


def _corrupt(shards, tmp_path):
    d = _copy(shards, tmp_path)
    f = d / "shard_00002.parquet"
    f.write_bytes(f.read_bytes()[:-50])
    return d


def _empty(shards, tmp_path):
    (tmp_path / "empty").mkdir()
    return tmp_path / "empty"


CASES = {
    "missing data dir": (lambda s, t: t / "nope", [], ["does not exist", "trainer.data prepare"]),
    "empty data dir": (_empty, [], ["is empty", "trainer.data prepare"]),
    "parquet without text": (_no_text, [], ["shard_00001.parquet has no `text` column"]),
    "corrupt shard": (_corrupt, [], ["shard_00002.parquet is corrupt", "copy the shards again"]),
    "impossible model": (lambda s, t: s, ["--n-embd", "100", "--n-head", "3"], ["not divisible"]),
    "bad flag value": (lambda s, t: s, ["--steps", "many"], ["--steps", "invalid int"]),
    "unknown flag": (lambda s, t: s, ["--depht", "2"], ["unrecognized arguments: --depht"]),
}
if not cpu_has_bf16():
    CASES["bf16 without bf16 units"] = (lambda s, t: s, ["--dtype", "bf16"],
                                        ["no bf16 units", "--dtype fp32"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_gives_one_line_and_exit_2(case, shards, tmp_path):
    make_data, extra, words = CASES[case]
    data, out = make_data(shards, tmp_path), tmp_path / "out"
    r = trainer(["--data", data, "--out", out, "--steps", "3", *TINY, *extra])
    lines = error_lines(r.stderr)
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and lines[0].startswith("ddplab: error: "), r.stderr
    for w in words:
        assert w in lines[0]
    assert not out.exists()


@pytest.mark.slow
def test_world_size_larger_than_row_groups(tmp_path):
    prepare(tmp_path / "one", None, 8, 8, 1, seed=0)  # a single row group
    out = tmp_path / "out"
    r = torchrun(["--data", tmp_path / "one", "--out", out, "--steps", "3", *TINY], nproc=2)
    assert r.returncode != 0
    ours = [ln for ln in r.stderr.splitlines() if ln.startswith("ddplab: error:")]
    assert ours and "1 row groups but the world size is 2" in ours[0]
    # no traceback from our code (torchrun prints its own): no frame in trainer/ (the checkout's own path
    # may hold "trainer/")
    assert not re.search(r'File "[^"]*/trainer/', r.stderr)
    assert not out.exists()


def test_existing_checkpoints_without_resume_are_not_overwritten(shards, tmp_path):
    out = tmp_path / "out"
    assert trainer(["--data", shards, "--out", out, "--steps", "2", *TINY]).returncode == 0
    before = sorted(p.name for p in (out / "ckpt").iterdir())
    r = trainer(["--data", shards, "--out", out, "--steps", "2", *TINY])
    assert r.returncode == 2 and "add --resume" in r.stderr
    assert sorted(p.name for p in (out / "ckpt").iterdir()) == before
