"""TrainConfig: derived sizes, validation messages, CLI flags."""

import dataclasses
import subprocess
import sys

import pytest
from conftest import REPO, env

from trainer.config import FIELD_HELP, TrainConfig, UsageError, parse_config


def test_depth_sets_width_and_heads():
    c = TrainConfig(data="d", out="o", depth=3)
    assert (c.n_embd, c.n_head) == (192, 3)
    c = TrainConfig(data="d", out="o", depth=1)
    assert (c.n_embd, c.n_head) == (64, 1)
    c = TrainConfig(data="d", out="o", depth=2, n_embd=96, n_head=2)
    assert (c.n_embd, c.n_head) == (96, 2)


@pytest.mark.parametrize("kw, words", [
    ({"n_embd": 100, "n_head": 3}, "not divisible"),
    ({"n_embd": 6, "n_head": 2}, "even"),
    ({"depth": 0}, "--depth"),
    ({"steps": 0}, "--steps"),
    ({"batch_size": 0}, "--batch-size"),
    ({"lr": -1.0}, "--lr"),
    ({"seq_len": 1}, "--seq-len"),
    ({"dtype": "fp8"}, "--dtype"),
    ({"comm": "carrier-pigeon"}, "--comm"),
    ({"pg_timeout_s": 1}, "--pg-timeout-s"),
    ({"run_id": "a b/c"}, "--run-id"),
    ({"data": ""}, "--data"),
])
def test_invalid_settings_raise_clear_usage_errors(kw, words):
    base = {"data": "d", "out": "o"} | kw
    with pytest.raises(UsageError, match=words):
        TrainConfig(**base)


def test_every_field_has_help_and_a_kebab_flag():
    fields = [f.name for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")]
    assert set(fields) == set(FIELD_HELP)
    out = subprocess.run([sys.executable, "-m", "trainer", "--help"], cwd=REPO, env=env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for name in fields:
        assert "--" + name.replace("_", "-") in out.stdout


def test_flags_map_onto_fields_and_config_roundtrips_as_json():
    c = parse_config(["--data", "d", "--out", "o", "--steps", "7", "--depth", "2", "--grad-accum", "3",
                      "--bucket-cap-mb", "1.5", "--resume", "--pg-timeout-s", "30"])
    assert (c.steps, c.depth, c.grad_accum, c.bucket_cap_mb) == (7, 2, 3, 1.5)
    assert (c.resume, c.pg_timeout_s) == (True, 30)
    again = TrainConfig(**{k: v for k, v in c.to_dict().items()})
    assert again.to_dict() == c.to_dict()
