"""Gradient communication options (--comm): real 2-rank gloo runs, and auto's decision rule."""

import json
import math

import pytest
from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import _should_compress

from tests.helpers.trainer_runs import TINY, read_jsonl, torchrun, trainer
from trainer.comm import AUTO_CANDIDATES, GradComm, decide, trial_plan
from trainer.model import GPT, GPTConfig

STEPS = 10
PSGD_RANK, PSGD_START = 2, 3
# several buckets (the model's 328 KB of gradients in 0.1 MiB buckets): PowerSGD on gloo hung with
# more than one bucket in flight before trainer/comm.py ran one bucket's chain at a time
ARGS = ["--steps", STEPS, *TINY, "--powersgd-rank", PSGD_RANK, "--powersgd-start-step", PSGD_START,
        "--timing-warmup-steps", 1, "--auto-trial-steps", 3, "--bucket-cap-mb", 0.1, "--pg-timeout-s", 30]
AUTO_STEPS = 16  # 1 warm-up + 2 untimed first steps + 3 rounds x 3 options = 12 trial steps, then 4


@pytest.fixture(scope="module")
def runs(shards, tmp_path_factory):
    """One 2-rank run per option: {option: (out dir, CompletedProcess)}."""
    done = {}
    for comm in ("fp32", "bf16", "fp16", "powersgd", "auto"):
        out = tmp_path_factory.mktemp(f"comm_{comm}") / "out"
        steps = ["--steps", AUTO_STEPS] if comm == "auto" else []
        r = torchrun(["--data", shards, "--out", out, "--comm", comm, *ARGS, *steps])
        assert r.returncode == 0, f"--comm {comm}: {r.stderr[-3000:]}"
        done[comm] = (out, r)
    return done


def summary(out, rank=None):
    name = "summary.json" if rank is None else f"summary.rank{rank}.json"
    return json.loads((out / name).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("comm", ["fp32", "bf16", "fp16", "powersgd", "auto"])
def test_every_option_trains_and_keeps_ranks_byte_identical(runs, comm):
    out, r = runs[comm]
    assert r.stdout.strip().splitlines()[-1] == "ddplab: done"
    s = summary(out)
    assert s["comm"] == comm and s["byte_equivalent"] is True
    assert summary(out, 0)["final_param_sha256"] == summary(out, 1)["final_param_sha256"]
    losses = [rec["loss"] for rec in read_jsonl(out / "metrics.rank0.jsonl")]
    assert all(math.isfinite(x) for x in losses) and losses[-1] < losses[0]
    for rank in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert all(rec["allreduce_ms"] > 0 and rec["buckets"] >= 1 for rec in recs)
        assert all(rec["buckets"] >= 3 for rec in recs[1:])  # after DDP rebuilt its buckets at step 1


@pytest.mark.slow
def test_each_hook_changes_what_is_applied(runs):
    """Compression is lossy: each option ends at its own parameters (the hook really ran)."""
    shas = {c: summary(out)["final_param_sha256"] for c, (out, _) in runs.items() if c != "auto"}
    assert len(set(shas.values())) == len(shas), shas


@pytest.mark.slow
def test_bytes_counted_are_what_each_option_sends(runs):
    fp32 = read_jsonl(runs["fp32"][0] / "metrics.rank0.jsonl")
    full = fp32[-1]["allreduce_bytes"]
    n_params = sum(p.numel() for p in GPT(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1)).parameters())
    assert full == 4 * n_params and all(rec["allreduce_bytes"] == full for rec in fp32)
    for half in ("bf16", "fp16"):
        recs = read_jsonl(runs[half][0] / "metrics.rank0.jsonl")
        assert all(rec["allreduce_bytes"] == full // 2 for rec in recs)
    # PowerSGD: plain all-reduces until its start step, then P and Q factors (+ uncompressed tensors),
    # counted here independently with torch's own compression rule
    model = GPT(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    numel = 0
    for p in model.parameters():
        n, m = p.shape[0], p.numel() // p.shape[0]
        r = min(n, m, PSGD_RANK)
        numel += (n + m) * r if _should_compress(n, m, r, 2)[0] else n * m
    psgd = read_jsonl(runs["powersgd"][0] / "metrics.rank0.jsonl")
    assert [rec["allreduce_bytes"] for rec in psgd[:PSGD_START]] == [full] * PSGD_START
    assert [rec["allreduce_bytes"] for rec in psgd[PSGD_START:]] == [4 * numel] * (STEPS - PSGD_START)
    assert 4 * numel < full / 4


@pytest.mark.slow
def test_auto_tries_each_candidate_in_lockstep_then_keeps_its_choice(runs):
    out, r = runs["auto"]
    s = summary(out)
    choice = s["comm_chosen"]
    assert choice in AUTO_CANDIDATES and s["comm_auto"]["choice"] == choice
    plan = ["fp32", "bf16", "powersgd"] + ["fp32", "bf16", "powersgd", "bf16", "powersgd", "fp32",
                                           "powersgd", "fp32", "bf16"]
    seqs = [[rec["comm"] for rec in read_jsonl(out / f"metrics.rank{k}.jsonl")] for k in (0, 1)]
    assert seqs[0] == seqs[1] == plan + [choice] * (AUTO_STEPS - len(plan))
    assert all(o["steps"] == 3 for o in s["comm_auto"]["options"].values())
    why = [ln for ln in r.stdout.splitlines() if ln.startswith("ddplab: comm auto: ")]
    assert len(why) == 1 and f"-> {choice}:" in why[0]
    for c in AUTO_CANDIDATES:
        assert f"{c} " in why[0] and c in s["comm_auto"]["options"]
    # the run's timing leaves the trial out: only steps with the chosen option count
    assert summary(out, 0)["timed_steps"] == AUTO_STEPS - len(plan)
    assert s["comm_timing_skip_steps"] == len(plan)


def test_auto_alone_is_plain_training(shards, tmp_path):
    r = trainer(["--data", shards, "--out", tmp_path / "o", "--steps", 3, *TINY, "--comm", "auto"])
    assert r.returncode == 0, r.stderr
    s = summary(tmp_path / "o")
    assert (s["comm"], s["comm_chosen"], s["comm_auto"]) == ("auto", "none", None)


def trial(comm, dts, compute=80.0, allreduce=10.0, nbytes=1000):
    """One rank's timed steps of one option, one per round."""
    return [{"comm": comm, "round": k, "dt_ms": dt, "compute_ms": compute, "allreduce_ms": allreduce,
             "bytes": nbytes} for k, dt in enumerate(dts)]


def test_decide_prefers_the_most_exact_option_unless_a_lossier_one_is_clearly_faster():
    ranks = [trial("fp32", [100, 101, 99]) + trial("bf16", [97, 98, 96]) + trial("powersgd", [70, 71, 69])]
    d = decide(ranks, tokens_per_step=1000)
    assert d["choice"] == "powersgd" and d["speedup_vs_fp32"] == pytest.approx(100 / 70, rel=1e-3)
    ranks = [trial("fp32", [100] * 3) + trial("bf16", [97] * 3) + trial("powersgd", [98] * 3)]
    assert decide(ranks, tokens_per_step=1000)["choice"] == "fp32"  # 3 % is below the margin
    ranks = [trial("fp32", [100] * 3) + trial("bf16", [80] * 3) + trial("powersgd", [78] * 3)]
    assert decide(ranks, tokens_per_step=1000)["choice"] == "bf16"  # powersgd only 2.5 % over bf16


def test_decide_keeps_fp32_when_the_gain_is_within_the_measured_spread():
    # bf16 is 20 % faster in the median round, but one round says 10 % slower: the rounds disagree by more
    # than the gain, so the trial cannot tell the options apart
    ranks = [trial("fp32", [100, 100, 100]) + trial("bf16", [83.3, 111, 80]) + trial("powersgd", [150] * 3)]
    d = decide(ranks, tokens_per_step=1000)
    assert d["choice"] == "fp32"
    assert d["judged"]["bf16"]["gain"] == pytest.approx(0.2, abs=0.01)
    assert d["judged"]["bf16"]["spread"] > d["judged"]["bf16"]["gain"]
    assert "spread" in d["why"]
    # the same median gain with consistent rounds is taken
    ranks = [trial("fp32", [100, 100, 100]) + trial("bf16", [83.3, 85, 80]) + trial("powersgd", [150] * 3)]
    assert decide(ranks, tokens_per_step=1000)["choice"] == "bf16"


def test_decide_compares_options_round_by_round():
    # the machine slows down in round 2 for every option: within-round ratios stay steady (+25 %)
    ranks = [trial("fp32", [100, 200, 100]) + trial("bf16", [80, 160, 80]) + trial("powersgd", [300] * 3)]
    d = decide(ranks, tokens_per_step=1000)
    assert d["choice"] == "bf16" and d["judged"]["bf16"]["spread"] == pytest.approx(0, abs=1e-3)
    assert d["options"]["fp32"]["step_ms"] == 100 and d["options"]["fp32"]["step_ms_max"] == 200


def test_decide_uses_the_slowest_rank_and_reports_alpha():
    fast = trial("fp32", [100] * 3) + trial("bf16", [60] * 3) + trial("powersgd", [90] * 3)
    slow = trial("fp32", [100] * 3) + trial("bf16", [150] * 3, allreduce=60) + trial("powersgd", [90] * 3)
    d = decide([fast, slow], tokens_per_step=500)
    assert d["choice"] == "powersgd"
    assert d["options"]["bf16"]["tokens_per_sec"] == pytest.approx(500 / 0.150, rel=1e-3)
    assert d["options"]["bf16"]["alpha"] == pytest.approx((10 + 60) / 160, abs=1e-3)
    assert "-> powersgd:" in d["why"]


def test_trial_plan_rotates_the_order_and_times_only_the_rounds():
    plan, rounds = trial_plan(warm=2, rounds=3)
    assert plan[:4] == ["fp32", "fp32", "bf16", "powersgd"] and rounds[:4] == [None] * 4
    timed = [(c, r) for c, r in zip(plan, rounds, strict=True) if r is not None]
    assert [c for c, _ in timed[:3]] == ["fp32", "bf16", "powersgd"]
    assert [c for c, _ in timed[3:6]] == ["bf16", "powersgd", "fp32"]
    for c in AUTO_CANDIDATES:
        assert sorted(r for o, r in timed if o == c) == [0, 1, 2]


def test_powersgd_state_only_when_it_may_be_used():
    from trainer.cli import parse_config
    from trainer.metrics import CommTimer

    def comm(*flags, world=2):
        return GradComm(parse_config(["--data", "d", "--out", "o", *flags]), world, CommTimer())

    assert comm().psgd is None and comm("--comm", "bf16").psgd is None
    assert comm("--comm", "auto", world=1).psgd is None
    assert comm("--comm", "powersgd").psgd is not None and comm("--comm", "auto").psgd is not None
    assert comm().summary()["comm"] == "fp32"


@pytest.mark.parametrize("flags, needle", [
    (["--powersgd-rank", "0"], "--powersgd-rank"),
    (["--powersgd-start-step", "1"], "--powersgd-start-step"),
    (["--auto-trial-steps", "0"], "--auto-trial-steps"),
    (["--auto-trial-steps", "2"], "--auto-trial-steps"),
])
def test_bad_comm_settings_are_refused(flags, needle):
    from trainer.cli import parse_config
    from trainer.config import UsageError

    with pytest.raises(UsageError, match=needle):
        parse_config(["--data", "d", "--out", "o", *flags])


def test_a_bad_comm_setting_is_one_line_and_exit_2(shards, tmp_path):
    r = trainer(["--data", shards, "--out", tmp_path / "o", "--steps", 2, *TINY, "--powersgd-rank", "0"])
    assert r.returncode == 2
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ddplab: error: --powersgd-rank")
    assert not (tmp_path / "o").exists()


def test_comm_flags_map_onto_the_config():
    from trainer.cli import parse_config

    base = ["--data", "d", "--out", "o"]
    c = parse_config(base)
    assert (c.comm, c.powersgd_warm_start, c.powersgd_rank, c.bucket_cap_mb) == ("fp32", True, 4, 25.0)
    c = parse_config([*base, "--comm", "powersgd", "--powersgd-rank", "8", "--no-powersgd-warm-start",
                      "--bucket-cap-mb", "4"])
    assert (c.comm, c.powersgd_warm_start, c.powersgd_rank, c.bucket_cap_mb) == ("powersgd", False, 8, 4.0)
    assert parse_config([*base, "--powersgd-warm-start"]).powersgd_warm_start is True


@pytest.mark.slow
def test_powersgd_resumes_from_a_checkpoint_with_fresh_compression_state(shards, tmp_path):
    """PowerSGD's per-rank error feedback is not checkpointed: a resumed run says so, starts the compression
    afresh (plain all-reduces for --powersgd-start-step steps) and its ranks still end byte-identical."""
    out = tmp_path / "out"
    first = torchrun(["--data", shards, "--out", out, "--comm", "powersgd", "--ckpt-every", 5, *ARGS])
    assert first.returncode == 0, first.stderr[-3000:]
    for f in (out / "ckpt").glob("step_000010.pt*"):  # as if the run had died between steps 5 and 10
        f.unlink()
    r = torchrun(["--data", shards, "--out", out, "--comm", "powersgd", "--ckpt-every", 5, *ARGS, "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "step 5" in r.stdout
    assert "--comm powersgd after a resume starts afresh" in r.stdout
    s = summary(out)
    assert s["resumed_from_step"] == 5 and s["byte_equivalent"] is True
    assert summary(out, 0)["final_param_sha256"] == summary(out, 1)["final_param_sha256"]
    recs = [x for x in read_jsonl(out / "metrics.rank0.jsonl") if x["step"] > 5]
    plain = [x for x in recs if x["step"] <= 5 + PSGD_START]  # PowerSGD's own warm-up, as at the start
    assert plain and all(x["allreduce_bytes"] == recs[0]["allreduce_bytes"] for x in plain)
    assert all(x["allreduce_bytes"] < plain[0]["allreduce_bytes"] for x in recs if x["step"] > 5 + PSGD_START)


@pytest.mark.parametrize("ms, choice", [({"fp32": 100, "bf16": 99, "powersgd": 98}, "fp32"),
                                        ({"fp32": 100, "bf16": 99, "powersgd": 50}, "powersgd")])
def test_the_auto_schedule_decides_from_its_rounds_and_frees_powersgd_unless_chosen(ms, choice):
    """The real schedule fed hand-made step times (one process: the gathers are local)."""
    from trainer.cli import parse_config
    from trainer.metrics import CommTimer

    cfg = parse_config(["--data", "d", "--out", "o", "--comm", "auto", "--timing-warmup-steps", "2"])
    gc = GradComm(cfg, 2, CommTimer(), log=lambda line: None)
    for step in range(len(gc.plan) + 2):
        option = gc.before_step(step)
        gc.after_step(step, {"dt_ms": ms[option], "compute_ms": 80.0, "allreduce_ms": 10.0,
                             "allreduce_bytes": 1000})
    assert gc.decision["choice"] == gc.current == choice
    assert all(o["steps"] == 3 for o in gc.decision["options"].values())
    assert (gc.psgd is None) == (choice != "powersgd")
    assert gc.summary()["powersgd"] == {"rank": 4, "warm_start": True, "start_step": 10}
