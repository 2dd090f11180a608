"""A one-rank run in this process: what the start costs (each shard hashed once) and what it writes."""

import json

from tests.helpers.trainer_runs import TINY
from trainer import train
from trainer.data import shards as shards_mod

RANK_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_each_shard_is_hashed_once_per_start(shards, tmp_path, monkeypatch):
    for k in RANK_ENV:
        monkeypatch.delenv(k, raising=False)
    hashed: list[str] = []
    real = shards_mod.sha256_file

    def counting(path, **kwargs):
        hashed.append(path.name)
        return real(path, **kwargs)

    monkeypatch.setattr(shards_mod, "sha256_file", counting)
    out = tmp_path / "run"
    assert train.main(["--data", str(shards), "--out", str(out), "--steps", "2", *TINY]) == 0
    manifest = json.loads((shards / "manifest.json").read_text())
    assert sorted(hashed) == sorted(f["file"] for f in manifest["files"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["byte_equivalent"] is True
