"""Real 2-rank gloo runs under torchrun on localhost."""

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest
import torch

from tests.helpers.elastic_runs import descendants
from tests.helpers.trainer_runs import (
    REPO,
    TINY,
    env,
    free_port,
    read_jsonl,
    read_live_jsonl,
    torchrun,
    torchrun_cmd,
)
from trainer.agreement import param_sha256
from trainer.data.shards import prepare
from trainer.model import GPT, GPTConfig, param_count

pytestmark = pytest.mark.slow

STEPS, KILL_AT, SLOW_S = 40, 23, 1.0
ARGS = ["--steps", STEPS, *TINY, "--batch-size", "8", "--grad-accum", "2", "--ckpt-every", "10",
        "--check-every", "10", "--lr", "3e-3"]


@pytest.fixture(scope="module")
def run_a(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("run_a") / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS])
    assert r.returncode == 0, r.stderr[-3000:]
    return out, r


def test_run_ends_with_done_and_writes_the_contract_files(run_a):
    out, r = run_a
    assert r.stdout.strip().splitlines()[-1] == "ddplab: done"
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "metrics.rank0.jsonl", "metrics.rank1.jsonl", "summary.json", "summary.rank0.json",
            "summary.rank1.json", "ckpt"} <= names
    s = json.loads((out / "summary.json").read_text())
    for k in ("params", "world_size", "steps", "tokens_per_sec", "allreduce_ms_p50", "allreduce_ms_p95",
              "comm_compute_ratio", "byte_equivalent", "torch_version", "dtype", "threads", "hosts",
              "data_digest", "loss_first", "loss_last", "final_param_sha256"):
        assert k in s, k
    assert (s["world_size"], s["steps"], s["dtype"], s["threads"]) == (2, STEPS, "fp32", 1)
    assert len(s["hosts"]) == 2
    assert s["torch_version"] == torch.__version__
    for rank in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert [r["step"] for r in recs] == list(range(1, STEPS + 1))
        for k in ("loss", "dt_ms", "tokens_per_sec", "compute_ms", "allreduce_ms", "allreduce_bytes", "lr"):
            assert all(isinstance(rec[k], (int, float)) for rec in recs)


def test_parameters_are_byte_identical_across_ranks(run_a):
    out, _ = run_a
    s0, s1 = (json.loads((out / f"summary.rank{r}.json").read_text()) for r in (0, 1))
    assert s0["final_param_sha256"] == s1["final_param_sha256"]
    # rank 1's own checksum equals the checksum of the model rank 0 saved in its final checkpoint
    state = torch.load(out / "ckpt" / f"step_{STEPS:06d}.pt", weights_only=True)
    c = state["config"]
    m = GPT(GPTConfig(seq_len=c["seq_len"], n_layer=c["depth"], n_embd=c["n_embd"], n_head=c["n_head"]))
    m.load_state_dict(state["model"])
    assert param_sha256(m) == s1["final_param_sha256"]
    assert json.loads((out / "summary.json").read_text())["byte_equivalent"] is True


def test_ranks_samples_are_disjoint_and_complete(run_a, small_shards):
    out, _ = run_a
    n = sum(f["row_groups"] for f in json.loads((small_shards / "manifest.json").read_text())["files"])
    held = json.loads((out / "config.json").read_text())["val_row_groups_resolved"]
    assert held == n // 16 > 0  # --val-row-groups auto: the last ones are for validation only
    read = [set(json.loads((out / f"summary.rank{r}.json").read_text())["row_groups_read"]) for r in (0, 1)]
    assert read[0].isdisjoint(read[1])
    assert read[0] | read[1] == set(range(n - held))  # the run is longer than one epoch
    for r in (0, 1):
        assert {rec["row_group"] % 2 for rec in read_jsonl(out / f"metrics.rank{r}.jsonl")} == {r}


def test_loss_falls_on_the_generated_corpus(run_a):
    out, _ = run_a
    losses = [r["loss"] for r in read_jsonl(out / "metrics.rank0.jsonl")]
    assert sum(losses[-5:]) / 5 < losses[0] - 1.5, losses


def test_allreduce_bytes_per_step_equal_the_gradient_size(run_a):
    out, _ = run_a
    s = json.loads((out / "summary.json").read_text())
    assert s["params"] == param_count(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    for r in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{r}.jsonl")
        # grad accumulation 2: no_sync on the first micro-step, so one all-reduce of all gradients per step
        assert {rec["allreduce_bytes"] for rec in recs} == {s["params"] * 4}
        assert all(rec["allreduce_ms"] > 0 and rec["buckets"] >= 1 for rec in recs)


def test_kill_and_resume_reproduces_the_uninterrupted_losses(run_a, small_shards, tmp_path):
    ref, _ = run_a
    out = tmp_path / "out"
    # The kill must land after step 23 and before step 30's checkpoint (else the torn step-20 one is not the
    # newest): 7 steps, ~0.2 s here, less than the poll below can take on a loaded machine (CI). The killed
    # run sleeps SLOW_S after each step past 23 (same numbers, a slower machine): 7 s of window, and no
    # added time, as the kill still comes one poll after step 23.
    cmd = torchrun_cmd(["--data", small_shards, "--out", out, *ARGS], module="tests.helpers.slowed_trainer")
    slow = {"SLOW_AFTER_STEP": str(KILL_AT), "SLOW_STEP_S": str(SLOW_S)}
    p = subprocess.Popen(cmd, cwd=REPO, env=env() | slow, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True)
    metrics = out / "metrics.rank0.jsonl"
    deadline = time.time() + 90
    try:
        while time.time() < deadline and p.poll() is None:
            if metrics.exists() and any(r["step"] >= KILL_AT for r in read_live_jsonl(metrics)):
                break
            time.sleep(0.02)
    finally:
        # torchrun starts its workers in their own sessions: SIGKILL the whole tree, workers first
        for pid in [*descendants(p.pid), p.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        p.wait(timeout=30)
    last = max(r["step"] for r in read_live_jsonl(metrics))  # a SIGKILL can leave half a line
    assert last >= KILL_AT, f"the run ended (step {last}) before step {KILL_AT}"
    assert not (out / "ckpt" / "step_000030.pt").exists(), \
        f"the kill landed after step 30's checkpoint (step {last}): make the steps after {KILL_AT} slower"
    # a torn newest checkpoint must be detected and the previous one used
    newest = out / "ckpt" / "step_000020.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "skipping" in r.stderr and "step_000020.pt" in r.stderr
    assert "resumed from" in r.stdout and "step 10" in r.stdout
    for rank in (0, 1):
        want = [(x["step"], x["loss"]) for x in read_jsonl(ref / f"metrics.rank{rank}.jsonl")]
        got = [(x["step"], x["loss"]) for x in read_jsonl(out / f"metrics.rank{rank}.jsonl")]
        assert got == want  # bit-exact, every step 1..40
    s_ref = json.loads((ref / "summary.json").read_text())
    s = json.loads((out / "summary.json").read_text())
    assert s["final_param_sha256"] == s_ref["final_param_sha256"] and s["resumed_from_step"] == 10


def test_a_rank_with_different_shards_fails_before_step_0(small_shards, tmp_path):
    other = tmp_path / "other"
    prepare(other, None, 64, 2, 8, seed=1)  # same layout, different documents
    port = free_port()
    procs = []
    for node, data in ((0, small_shards), (1, other)):
        cmd = torchrun_cmd(["--data", data, "--out", tmp_path / f"out{node}", *ARGS], nproc=1, nnodes=2,
                           node_rank=node, port=port)
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=120) for p in procs]
    for node, (p, (_, err)) in enumerate(zip(procs, results, strict=True)):
        assert p.returncode != 0
        ours = [ln for ln in err.splitlines() if ln.startswith("ddplab: error:")]
        assert ours, err[-2000:]
        assert "ranks would train on different data" in ours[0] and "rank 1 on" in ours[0]
        assert "differing files: shard_00000.parquet" in ours[0]
        assert "exitcode  : 3" in err  # torchrun reports the rank's exit code
        assert not (tmp_path / f"out{node}").exists()  # failed before step 0, nothing written
