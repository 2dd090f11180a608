"""The validation loss and the all-reduced train loss on real 2-rank gloo runs (torchrun on localhost)."""

import json

import pytest
import torch

from tests.helpers.trainer_runs import TINY, error_lines, read_jsonl, torchrun, trainer
from trainer.data.heldout import ValBatches, split
from trainer.data.shards import open_dataset
from trainer.model import GPT, GPTConfig

pytestmark = pytest.mark.slow

STEPS = 16  # 4 x 32 tokens per rank and step: 256 global tokens per step
ARGS = ["--steps", STEPS, *TINY, "--log-every", "2", "--lr", "3e-3", "--val-row-groups", "4",
        "--eval-batches", "5", "--ckpt-every", "8", "--straggler-every", "0"]


def val_loss_of(ckpt, shards) -> float:
    """The validation loss of a checkpoint's model, on one process, over the whole validation set."""
    state = torch.load(ckpt, weights_only=False)
    c = state["config"]
    model = GPT(GPTConfig(seq_len=c["seq_len"], n_layer=c["depth"], n_embd=c["n_embd"], n_head=c["n_head"]))
    model.load_state_dict(state["model"])
    vb = ValBatches(split(open_dataset(shards), c["val_row_groups"])[1], c["batch_size"], c["seq_len"],
                    c["eval_batches"])
    total = count = 0.0
    with torch.no_grad():
        for k in range(len(vb.batches)):
            x, y = vb.batch(k)
            total += model(x, y).item() * y.numel()
            count += y.numel()
    return total / count


@pytest.fixture(scope="module")
def synced(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("val") / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--eval-every-tokens", "1000"])
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_validation_at_each_crossed_multiple_of_the_tokens_and_at_the_end(synced):
    out, r = synced
    s = json.loads((out / "summary.json").read_text())
    # 256 tokens per step: 1000, 2000, 3000, 4000 are crossed at steps 4, 8, 12, 16 (the last)
    assert [t for t, _ in s["val_curve"]] == [1024, 2048, 3072, 4096]
    assert s["val_loss"] == s["val_curve"][-1][1] and s["val_row_groups"] == 4 and s["val_sequences"] == 20
    for rank in (0, 1):  # every rank got the same all-reduced mean
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert [[m["tokens_seen"], m["val_loss"]] for m in recs if "val_loss" in m] == s["val_curve"]
        assert [m["tokens_seen"] for m in recs] == [256 * k for k in range(1, STEPS + 1)]
    assert "ddplab: validation: 4 held-out row groups, 20 sequences (640 tokens), evaluated every 1000 " \
           "tokens and at the end" in r.stdout
    assert f"| val {s['val_loss']:.4f} |" in r.stdout.splitlines()[-2]


def test_the_all_reduced_validation_loss_is_the_whole_sets_loss(synced, small_shards):
    out, _ = synced
    s = json.loads((out / "summary.json").read_text())
    for step, (_, loss) in ((8, s["val_curve"][1]), (16, s["val_curve"][3])):
        want = val_loss_of(out / "ckpt" / f"step_{step:06d}.pt", small_shards)
        assert loss == pytest.approx(want, rel=1e-6)


def test_loss_mean_is_the_mean_over_the_ranks_on_log_steps(synced):
    out, r = synced
    ranks = [read_jsonl(out / f"metrics.rank{k}.jsonl") for k in (0, 1)]
    logged = [a["step"] for a in ranks[0] if "loss_mean" in a]
    assert logged == [1, *range(2, STEPS + 1, 2)]  # the first step, every --log-every, the last
    for a, b in zip(*ranks, strict=True):
        if "loss_mean" in a:
            assert a["loss_mean"] == b["loss_mean"] == pytest.approx((a["loss"] + b["loss"]) / 2, rel=1e-12)
    s = json.loads((out / "summary.json").read_text())
    assert s["loss_last"] == ranks[0][-1]["loss_mean"] and s["loss_first"] == ranks[0][0]["loss_mean"]
    assert s["ranks"][1]["loss_last"] == ranks[1][-1]["loss"]  # each rank's own stays in its row
    assert f"loss {ranks[0][-1]['loss_mean']:.4f} |" in r.stdout


def test_local_sgd_evaluates_at_the_first_sync_after_the_threshold(small_shards, tmp_path):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--eval-every-tokens", "1500",
                  "--sync-every", "4", "--allow-local-sgd", "--log-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    # syncs at steps 4, 8, 12, 16 (1024 tokens apart): 1500 is crossed by step 8, 3000 by 12, then the end
    assert [t for t, _ in s["val_curve"]] == [2048, 3072, 4096]
    recs = read_jsonl(out / "metrics.rank1.jsonl")
    assert all(m["synced"] for m in recs if "val_loss" in m)
    assert [m["step"] for m in recs if "loss_mean" in m] == [1, 4, 8, 12, 16]  # no wait between syncs
    assert "(rank 0)" in r.stdout.splitlines()[-5]  # step 15's line: rank 0's own loss, said so
    assert s["val_loss"] == pytest.approx(val_loss_of(out / "ckpt" / f"step_{STEPS:06d}.pt", small_shards),
                                          rel=1e-6)


def test_no_validation_with_val_row_groups_0(small_shards, tmp_path):
    r = trainer(["--data", small_shards, "--out", tmp_path / "out", *ARGS, "--val-row-groups", "0"])
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert s["val_curve"] == [] and s["val_loss"] is None and s["val_row_groups"] == 0
    assert "validation" not in r.stdout


@pytest.mark.parametrize("held, words", [(32, "holds out every row group of the data set"),
                                         (40, "exceeds the data set's 32 row groups")])
def test_holding_out_too_much_is_one_error_line(small_shards, tmp_path, held, words):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--val-row-groups", held])
    ours = [ln for ln in error_lines(r.stderr) if ln.startswith("ddplab: error:")]
    assert r.returncode != 0 and ours and words in ours[0] and "--val-row-groups" in ours[0]
    assert not out.exists()
