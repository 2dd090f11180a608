"""The node's fp32 GEMM peak and the MFU a run reports against it; the fused optimizer."""

import json
import math

import pytest
import torch

from tests.helpers.trainer_runs import TINY, read_jsonl, trainer
from trainer.optim import can_fuse, make_adamw
from trainer.peak import measure_peak_flops, mfu


def test_the_gemm_measure_is_a_positive_finite_flop_rate():
    flops = measure_peak_flops(n=128, budget_s=0.05)
    assert math.isfinite(flops) and flops > 1e6


def test_mfu_is_model_flops_over_the_sum_of_the_peaks():
    assert mfu(100.0, 10.0, [1000.0, 1000.0]) == pytest.approx(0.5)
    assert mfu(100.0, None, [1000.0]) is None and mfu(100.0, 10.0, []) is None


def test_a_tiny_run_reports_mfu_per_step_and_in_its_summary(shards, tmp_path):
    r = trainer(["--data", shards, "--out", tmp_path / "o", "--steps", 3, *TINY])
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert len(s["peak_flops_per_rank"]) == 1 and s["peak_flops_per_rank"][0] > 0
    assert 0 < s["mfu"] < 1.5
    assert s["mfu"] == pytest.approx(s["flops_per_token"] * s["tokens_per_sec"] / s["peak_flops_per_rank"][0])
    assert all(0 < rec["mfu"] < 1.5 for rec in read_jsonl(tmp_path / "o" / "metrics.rank0.jsonl"))


def test_adamw_is_fused_on_cpu_and_updates_as_the_default_does():
    torch.manual_seed(0)
    a = [torch.nn.Parameter(torch.randn(8, 4)) for _ in range(2)]
    b = [torch.nn.Parameter(p.detach().clone()) for p in a]
    fused, plain = make_adamw(a, 1e-2, 0.1), torch.optim.AdamW(b, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                                               weight_decay=0.1)
    assert can_fuse(a) and fused.defaults["fused"] is True
    for _ in range(3):
        for pa, pb in zip(a, b, strict=True):
            pa.grad = torch.full_like(pa, 0.5)
            pb.grad = torch.full_like(pb, 0.5)
        fused.step()
        plain.step()
    for pa, pb in zip(a, b, strict=True):
        torch.testing.assert_close(pa, pb)
    assert not can_fuse([torch.zeros(2, dtype=torch.int64)])

