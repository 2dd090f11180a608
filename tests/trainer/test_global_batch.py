"""--global-batch-tokens: 1 rank and 2 ranks take the same optimizer steps (tokens per step, learning
rates) and, reading the data in the same order (--balance's shared stream, --elastic), the same losses; an
elastic group that shrinks recomputes the accumulation and goes on with the same steps."""

import json
import shutil
import subprocess

import pytest

from tests.helpers.trainer_runs import REPO, TINY, env, read_jsonl, torchrun, torchrun_cmd, trainer

pytestmark = pytest.mark.slow

G, STEPS = 512, 12  # 4 sequences x 32 tokens per micro-step: grad-accum 4 on 1 rank, 2 on 2 ranks
ARGS = ["--steps", STEPS, *TINY, "--global-batch-tokens", G, "--log-every", "1", "--lr", "3e-3",
        "--val-row-groups", "2", "--eval-every-tokens", "1024", "--straggler-every", "0",
        "--check-every", "6", "--timing-warmup-steps", "1"]


def run(shards, out, nproc, *extra):
    args = ["--data", shards, "--out", out, *ARGS, *extra]
    r = trainer(args) if nproc == 1 else torchrun(args, nproc=nproc)
    assert r.returncode == 0, r.stderr[-3000:]
    return read_jsonl(out / "metrics.rank0.jsonl"), json.loads((out / "config.json").read_text())


def val_curve(out):
    return json.loads((out / "summary.json").read_text())["val_curve"]


def steps_of(recs):
    return [(m["step"], m["tokens"], m["lr"]) for m in recs]


@pytest.mark.parametrize("mode", [["--balance", "--balance-every", "1000"], []], ids=["balance", "strided"])
def test_one_rank_and_two_ranks_take_the_same_steps(small_shards, tmp_path, mode):
    one, c1 = run(small_shards, tmp_path / "one", 1, *mode)
    two, c2 = run(small_shards, tmp_path / "two", 2, *mode)
    assert (c1["grad_accum"], c2["grad_accum"]) == (4, 2)
    assert c1["tokens_per_step"] == c2["tokens_per_step"] == G
    assert steps_of(one) == steps_of(two) == [(s, G, one[s - 1]["lr"]) for s in range(1, STEPS + 1)]
    curves = [val_curve(tmp_path / name) for name in ("one", "two")]
    assert [t for t, _ in curves[0]] == [t for t, _ in curves[1]] == [1024 * k for k in range(1, 7)]
    if mode:  # the same sequences per step (the union batch): the same loss, to fp32 rounding
        assert [m["loss_mean"] for m in two] == pytest.approx([m["loss"] for m in one], rel=2e-5)
        assert [v for _, v in curves[1]] == pytest.approx([v for _, v in curves[0]], rel=2e-5)
    else:  # other row groups per rank: close, not equal
        tail = [sum(m["loss_mean"] for m in recs[-4:]) / 4 for recs in (one, two)]
        assert tail[1] == pytest.approx(tail[0], rel=0.05)
        assert curves[1][-1][1] == pytest.approx(curves[0][-1][1], rel=0.05)


def test_an_elastic_group_of_two_that_shrinks_to_one_goes_on_with_the_same_steps(small_shards, tmp_path):
    elastic = ["--elastic", "--ckpt-every", "6", "--ckpt-keep", "5"]
    ref, _ = run(small_shards, tmp_path / "ref", 2, *elastic)
    out = tmp_path / "shrunk"
    (out / "ckpt").mkdir(parents=True)
    for p in (tmp_path / "ref" / "ckpt").glob("step_000006.pt*"):
        shutil.copy(p, out / "ckpt" / p.name)
    cmd = torchrun_cmd(["--data", small_shards, "--out", out, *ARGS, *elastic], nproc=1)
    r = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming at step 6" in r.stdout and "x 1 ranks x 4 micro-steps (--grad-accum 4)" in r.stdout
    after = read_jsonl(out / "metrics.rank0.jsonl")
    assert json.loads((out / "config.json").read_text())["grad_accum"] == 4
    assert steps_of(after) == steps_of(ref)[6:]
    assert [m["tokens_seen"] for m in after] == [G * s for s in range(7, STEPS + 1)]
    assert [m["loss_mean"] for m in after] == pytest.approx([m["loss_mean"] for m in ref[6:]], rel=2e-5)
    curve, ref_curve = val_curve(out), val_curve(tmp_path / "ref")
    assert curve[:3] == ref_curve[:3]  # the points before the checkpoint travelled in it
    assert [t for t, _ in curve] == [t for t, _ in ref_curve]
    assert [v for _, v in curve[3:]] == pytest.approx([v for _, v in ref_curve[3:]], rel=2e-5)
