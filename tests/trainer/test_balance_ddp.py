"""--balance on a real 2-rank gloo group (localhost): the update equals one process on the union batch,
and a resume keeps the shares and the data position."""

import shutil

import pytest
import torch

from tests.helpers.trainer_runs import TINY, read_jsonl, torchrun, trainer

pytestmark = pytest.mark.slow

STEPS, G = 12, 16
COMMON = ["--steps", STEPS, *TINY, "--ckpt-every", "6", "--check-every", "6", "--lr", "3e-3",
          "--timing-warmup-steps", "1", "--straggler-every", "0"]
BALANCED = [*COMMON, "--batch-size", "4", "--grad-accum", "2", "--balance", "--balance-every", "2",
            "--balance-damping", "1"]


def global_losses(out, world=2) -> list[float]:
    """Per step: the mean loss over the global batch, from each rank's loss weighted by its share."""
    ranks = [read_jsonl(out / f"metrics.rank{r}.jsonl") for r in range(world)]
    return [sum(recs[i]["loss"] * recs[i]["share"] for recs in ranks) / G for i in range(len(ranks[0]))]


def final_params(out) -> dict:
    return torch.load(out / "ckpt" / f"step_{STEPS:06d}.pt", weights_only=False)["model"]


@pytest.fixture(scope="module")
def balanced(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("bal") / "out"
    r = torchrun(["--data", small_shards, "--out", out, *BALANCED])
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


@pytest.fixture(scope="module")
def union(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("union") / "out"
    r = trainer(["--data", small_shards, "--out", out, *COMMON, "--batch-size", G, "--grad-accum", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_balanced_update_equals_one_process_on_the_union_batch(balanced, union):
    out, _ = balanced
    recs = [read_jsonl(out / f"metrics.rank{r}.jsonl") for r in range(2)]
    pairs = list(zip(*recs, strict=True))
    assert all(a["share"] + b["share"] == G and min(a["share"], b["share"]) >= 1 for a, b in pairs)
    one = [r["loss"] for r in read_jsonl(union / "metrics.rank0.jsonl")]
    assert global_losses(out) == pytest.approx(one, rel=2e-5)
    a, b = final_params(out), final_params(union)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=2e-5)


def test_metrics_carry_share_compute_and_wait(balanced):
    out, r = balanced
    rec = read_jsonl(out / "metrics.rank1.jsonl")[-1]
    assert {"share", "compute_ms", "wait_ms"} <= set(rec) and rec["wait_ms"] == rec["exposed_ms"]
    import json

    summary = json.loads((out / "summary.json").read_text())
    changes = summary["balance"]["changes"]
    in_force = next((c["to"] for c in reversed(changes) if c["step"] < STEPS), [G // 2, G // 2])
    assert in_force == [rank["share_last"] for rank in summary["ranks"]]
    assert all(c["step"] % 2 == 0 and sum(c["to"]) == G for c in summary["balance"]["changes"])
    for c in summary["balance"]["changes"]:
        assert f"step {c['step']}: shares {c['from']} -> {c['to']}" in r.stdout


def test_resume_keeps_the_shares_and_the_data_position(balanced, tmp_path, small_shards):
    out, _ = balanced
    ckpt6 = torch.load(out / "ckpt" / "step_000006.pt", weights_only=False)
    again = tmp_path / "out"
    shutil.copytree(out, again)
    for p in (again / "ckpt").glob(f"step_{STEPS:06d}.pt*"):
        p.unlink()
    r = torchrun(["--data", small_shards, "--out", again, *BALANCED, "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout
    step7 = [read_jsonl(again / f"metrics.rank{k}.jsonl")[6] for k in range(2)]
    assert [s["share"] for s in step7] == ckpt6["balance"]["shares"]
    assert ckpt6["data"][0] == ckpt6["data"][1] == {"mode": "shared_stream", **{
        k: ckpt6["data"][0][k] for k in ("epoch", "offset")}}
    # the same global batches after the resume (shares may differ: fp32 tolerance, not bits)
    assert global_losses(again) == pytest.approx(global_losses(out), rel=2e-5)
    for k, v in final_params(out).items():
        torch.testing.assert_close(final_params(again)[k], v, rtol=1e-4, atol=2e-5)
