"""Low-communication mode (--sync-every H): the schedule, the flag checks, the sync on a real 2-rank gloo
group against a hand computation, and 2-rank torchrun runs (agreement after every sync, exact resume)."""

import datetime
import io
import json
import shutil
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.trainer_runs import REPO, TINY, env, error_lines, free_port, read_jsonl, torchrun
from trainer import quant_wire
from trainer.agreement import param_sha256
from trainer.cli import check_args
from trainer.config import UsageError
from trainer.local_sgd import LocalSGD, crossed, split_fragments
from trainer.model import GPTConfig, param_count

# --- the schedule (pure) ----------------------------------------------------------------------------


def test_a_check_due_between_syncs_moves_to_the_next_sync():
    # every 6 steps, syncs at 4, 8, 12: the check due at 6 happens at 8, the one at 12 at 12
    syncs = [4, 8, 12, 16, 20, 24]
    got = [s for prev, s in zip([0, *syncs], syncs, strict=False) if crossed(6, prev, s)]
    assert got == [8, 12, 20, 24]
    # a sync every step: exactly the multiples
    assert [d for d in range(1, 25) if crossed(6, d - 1, d)] == [6, 12, 18, 24]
    assert not any(crossed(0, d - 1, d) for d in range(1, 25))  # 0: never (only at the end)


def test_syncs_every_h_steps_and_at_the_last_step():
    m = LocalSGD([torch.zeros(3)], sync_every=4, steps=10, outer_lr=1.0, outer_momentum=0.0)
    assert [d for d in range(1, 11) if m.due(d)] == [4, 8, 10]


def test_after_a_per_step_warm_up_syncs_count_h_steps_from_its_end():
    m = LocalSGD([torch.zeros(3)], sync_every=4, steps=20, outer_lr=1.0, outer_momentum=0.0,
                 per_step_until=6)
    assert [d for d in range(1, 21) if m.per_step(d)] == [1, 2, 3, 4, 5, 6]
    assert [d for d in range(1, 21) if m.due(d)] == [10, 14, 18, 20]


# --- flags ------------------------------------------------------------------------------------------

BASE = ["--data", "d", "--out", "o"]


@pytest.mark.parametrize("extra, flag, words", [
    (["--sync-every", "4"], "--sync-every", "add --allow-local-sgd"),
    (["--sync-every", "4", "--allow-local-sgd", "--comm", "auto"], "--comm", "use --comm fp32"),
    (["--sync-every", "4", "--allow-local-sgd", "--comm", "powersgd"], "--comm", "bf16/fp16 to send"),
    (["--sync-every", "4", "--allow-local-sgd", "--balance"], "--balance", "use one of the two"),
    (["--sync-every", "0"], "--sync-every", "must be at least 1"),
    (["--sync-every", "2", "--allow-local-sgd", "--outer-momentum", "1"], "--outer-momentum", "[0, 1)"),
    (["--sync-every", "2", "--allow-local-sgd", "--outer-lr", "0"], "--outer-lr", "must be positive"),
    (["--sync-overlap"], "--sync-overlap", "add --sync-every H"),
    (["--sync-every-after", "10"], "--sync-every-after", "add --sync-every H"),
    (["--sync-every", "4", "--allow-local-sgd", "--sync-every-after", "-1"], "--sync-every-after", ">= 0"),
    (["--sync-every", "4", "--allow-local-sgd", "--steps", "50", "--sync-every-after", "50"],
     "--sync-every-after", "leaves no local steps"),
    (["--comm", "int8"], "--comm", "add --sync-every H"),
    (["--comm", "int4"], "--comm", "or use --comm bf16"),
    (["--sync-every", "4", "--allow-local-sgd", "--comm", "int8", "--sync-overlap"], "--sync-overlap",
     "drop --sync-overlap"),
    (["--sync-fragments", "0"], "--sync-fragments", "at least 1"),
    (["--sync-fragments", "2"], "--sync-fragments", "use an H > 1 that 2 divides"),
    (["--sync-every", "6", "--allow-local-sgd", "--sync-fragments", "4"], "--sync-fragments",
     "(e.g. --sync-every 8)"),
])
def test_bad_local_sgd_flags_give_one_line_naming_the_flag(extra, flag, words):
    line = check_args(BASE + extra)
    assert line is not None and line.startswith(f"trainer argument {flag}:") and words in line, line
    assert "\n" not in line


def test_local_sgd_flags_that_fit_are_accepted():
    assert check_args(BASE + ["--sync-every", "8", "--allow-local-sgd", "--outer-lr", "1",
                              "--outer-momentum", "0", "--ckpt-every", "5", "--check-every", "3"]) is None
    assert check_args(BASE + ["--sync-every", "1"]) is None  # today's DDP needs no permission
    for wire in ("bf16", "fp16"):  # the parameter change of each sync travels in 16 bits
        assert check_args(BASE + ["--sync-every", "8", "--allow-local-sgd", "--comm", wire]) is None
    assert check_args(BASE + ["--sync-every", "4", "--allow-local-sgd", "--sync-overlap"]) is None
    for wire in ("int8", "int4"):  # low-bit codes with a scale per block, all-gathered
        assert check_args(BASE + ["--sync-every", "8", "--allow-local-sgd", "--comm", wire]) is None
    assert check_args(BASE + ["--sync-every", "8", "--allow-local-sgd", "--sync-every-after", "20"]) is None
    assert check_args(BASE + ["--sync-every", "8", "--allow-local-sgd", "--sync-fragments", "4",
                              "--sync-overlap"]) is None


def test_fragments_are_runs_of_whole_tensors_of_about_equal_size():
    offsets = [0, 100, 110, 210, 220, 320, 330, 430]  # 7 tensors: 100, 10, 100, 10, 100, 10, 100 values
    assert split_fragments(offsets, 1) == [(0, 7)]
    assert split_fragments(offsets, 2) == [(0, 4), (4, 7)]
    assert split_fragments(offsets, 4) == [(0, 2), (2, 4), (4, 6), (6, 7)]  # 110, 110, 110, 100
    assert split_fragments([0, 1000, 1001, 1002], 3) == [(0, 1), (1, 2), (2, 3)]  # one tensor each at least
    with pytest.raises(UsageError, match="the model has 3 parameter tensors; use 1 to 3"):
        split_fragments([0, 1000, 1001, 1002], 4)


def test_the_cli_refuses_local_sgd_without_permission_in_one_line():
    r = subprocess.run([sys.executable, "-m", "trainer", "--data", "d", "--out", "o", "--sync-every", "4"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert error_lines(r.stderr) == [ln for ln in r.stderr.splitlines() if ln.startswith("ddplab: error: ")]
    assert len(error_lines(r.stderr)) == 1 and "--allow-local-sgd" in r.stderr


# --- the sync on a real 2-rank gloo group -----------------------------------------------------------


# Every sync the tests below check, run by one pair of ranks (each rank a process that imports torch: one
# pair for all of them, not one per test): name -> (outer_lr, outer_momentum, wire, overlap[, fragments]).
SCENARIOS = {
    "fragments": (1.0, 0.0, "fp32", False, 2),
    "fragments-overlap": (1.0, 0.0, "bf16", True, 2),
    "overlap-plain": (1.0, 0.0, "fp32", True),
    "overlap-nesterov": (0.7, 0.9, "fp32", True),
    "plain": (1.0, 0.0, "fp32", False),
    "nesterov": (0.7, 0.9, "fp32", False),
    "nesterov-bf16": (0.7, 0.9, "bf16", False),
    "nesterov-fp16": (0.7, 0.9, "fp16", False),
    "plain-bf16": (1.0, 0.0, "bf16", False),
    "plain-int8": (1.0, 0.0, "int8", False),
}


def _scenario(outer_lr, outer_momentum, wire, overlap, fragments=1) -> list[dict]:
    """One rank's run from the same model. Blocking: syncs after steps 3 and 6. Overlapped: sync points
    after steps 2, 4 and 6 start a sync, the one after 8 (the end) lands it and agrees. Two fragments
    (H 4): one fragment after steps 2, 4 and 6, everything after 8 (the end)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    every, steps = (4, 8) if fragments > 1 else (2, 8) if overlap else (3, 6)
    ls = LocalSGD(model.parameters(), every, steps, outer_lr, outer_momentum, wire=wire, overlap=overlap,
                  fragments=fragments)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    out = []
    for step in range(1, steps + 1):
        x, y = torch.randn(8, 5, generator=gen), torch.randn(8, 1, generator=gen)
        torch.nn.functional.mse_loss(model(x), y).backward()
        inner.step()
        inner.zero_grad()
        if ls.due(step):
            before = [p.detach().clone() for p in model.parameters()]
            sha_before = param_sha256(model)
            info = ls.exchange(step) if (overlap or fragments > 1) and step < steps else ls.sync()
            out.append({"before": before, "after": [p.detach().clone() for p in model.parameters()],
                        "sha_before": sha_before, "sha_after": param_sha256(model),
                        "bytes": info["sync_bytes"]})
    return out


def _worker(rank, port, q):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    out = {name: _scenario(*args) for name, args in SCENARIOS.items()}
    buf = io.BytesIO()  # as bytes: a queued tensor's shared memory is gone once this process exits
    torch.save(out, buf)
    q.put((rank, buf.getvalue()))
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def synced() -> dict[str, tuple[list[dict], list[dict]]]:
    """name -> (rank 0's syncs, rank 1's syncs) for every scenario, from one 2-rank gloo group."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = {r: torch.load(io.BytesIO(b)) for r, b in (q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return {name: (got[0][name], got[1][name]) for name in SCENARIOS}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["overlap-plain", "overlap-nesterov"])
def test_an_overlapped_sync_lands_one_sync_late_and_keeps_each_ranks_progress(synced, name):
    r0, r1 = synced[name]
    outer_lr, outer_momentum, _, _ = SCENARIOS[name]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    anchor, buf = [p.detach().clone() for p in m.parameters()], None
    numel = sum(a.numel() for a in anchor)
    sent = None  # the snapshots whose all-reduce is under way

    def outer_step(snaps):  # by hand: g = mean over ranks of (anchor - snapshot_r); plain or Nesterov
        nonlocal anchor, buf
        g = [(a - s0) / 2 + (a - s1) / 2 for a, s0, s1 in zip(anchor, *snaps, strict=True)]
        if outer_momentum == 0:
            anchor = [a - outer_lr * gi for a, gi in zip(anchor, g, strict=True)]
            return
        buf = g if buf is None else [outer_momentum * b + gi for b, gi in zip(buf, g, strict=True)]
        anchor = [a - outer_lr * (gi + outer_momentum * b) for a, gi, b in zip(anchor, g, buf, strict=True)]

    assert len(r0) == 4  # sync points after steps 2, 4, 6 and 8 (the end)
    for i, (s0, s1) in enumerate(zip(r0, r1, strict=True)):
        assert s0["bytes"] == numel * 4
        if sent is None:  # the first sync point only starts a sync: nothing changes yet
            for s in (s0, s1):
                assert all(torch.equal(a, b) for a, b in zip(s["after"], s["before"], strict=True))
            sent = (s0["after"], s1["after"])
            continue
        # the sync started one point earlier lands: new anchor + each rank's progress since its snapshot
        outer_step(sent)
        landed = [[a + (b - sn) for a, b, sn in zip(anchor, s["before"], snap, strict=True)]
                  for s, snap in ((s0, sent[0]), (s1, sent[1]))]
        if i < len(r0) - 1:
            for s, want in zip((s0, s1), landed, strict=True):
                for w, got in zip(want, s["after"], strict=True):
                    torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
            assert s0["sha_after"] != s1["sha_after"]  # each rank keeps its own progress
            sent = (s0["after"], s1["after"])
        else:  # the end: after the pending sync lands, a blocking sync of what is left; the ranks agree
            outer_step(landed)
            for w, got in zip(anchor, s0["after"], strict=True):
                torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
            assert s0["sha_after"] == s1["sha_after"]


FRAGMENT_TURNS = [(0, 1), (1, 4), (0, 1)]  # the first Linear's weight (20 of 29 values), then the rest


@pytest.mark.slow
def test_fragments_sync_in_turn_and_everything_at_the_end(synced):
    r0, r1 = synced["fragments"]
    sizes = [t.numel() for t in r0[0]["before"]]
    assert len(r0) == 4  # points after steps 2, 4 and 6: one fragment each, in turn; after 8 (the end): all
    for s0, s1, (first, end) in zip(r0, r1, [*FRAGMENT_TURNS, (0, 4)], strict=True):
        assert s0["bytes"] == s1["bytes"] == sum(sizes[first:end]) * 4
        for i, (b0, b1, a0, a1) in enumerate(zip(s0["before"], s1["before"], s0["after"], s1["after"],
                                                  strict=True)):
            if first <= i < end:  # averaged: anchor - mean(anchor - theta_r), the same on both ranks
                assert torch.equal(a0, a1) and not torch.equal(b0, b1)
                torch.testing.assert_close(a0, (b0 + b1) / 2, rtol=1e-5, atol=1e-6)
            else:  # not its turn: each rank keeps its own
                assert torch.equal(a0, b0) and torch.equal(a1, b1)
    assert r0[0]["sha_after"] != r1[0]["sha_after"] and r0[-1]["sha_after"] == r1[-1]["sha_after"]


@pytest.mark.slow
def test_an_overlapped_fragment_lands_at_the_next_fragments_turn(synced):
    r0, r1 = synced["fragments-overlap"]
    sizes = [t.numel() for t in r0[0]["before"]]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    anchor = [p.detach().clone() for p in m.parameters()]

    def land(i, snaps):  # plain averaging of the bf16-rounded halves of each rank's change
        anchor[i] = anchor[i] - _mean_in_16_bits(anchor[i] - snaps[0][i], anchor[i] - snaps[1][i],
                                                 torch.bfloat16)

    pending = None  # (fragment, each rank's snapshot)
    for k, (s0, s1) in enumerate(zip(r0, r1, strict=True)):
        want = [list(s0["before"]), list(s1["before"])]
        if pending:  # the previous turn's fragment lands: new anchor + each rank's progress since
            (first, end), snaps = pending
            for i in range(first, end):
                land(i, snaps)
                for r in (0, 1):
                    want[r][i] = anchor[i] + (want[r][i] - snaps[r][i])
        if k < len(FRAGMENT_TURNS):
            first, end = FRAGMENT_TURNS[k]
            assert s0["bytes"] == sum(sizes[first:end]) * 2
            for w, got in zip(want[0] + want[1], s0["after"] + s1["after"], strict=True):
                torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6)
            pending = ((first, end), (s0["after"], s1["after"]))
        else:  # the end: after the landing, everything syncs and the ranks agree
            for i in range(len(anchor)):
                land(i, want)
                torch.testing.assert_close(s0["after"][i], anchor[i], rtol=1e-5, atol=1e-6)
            assert s0["sha_after"] == s1["sha_after"]


@pytest.mark.slow
def test_plain_local_sgd_is_the_average_of_the_ranks_parameters_bit_for_bit(synced):
    r0, r1 = synced["plain"]
    assert len(r0) == 2  # syncs after steps 3 and 6
    numel = sum(t.numel() for t in r0[0]["before"])
    for s0, s1 in zip(r0, r1, strict=True):
        assert s0["sha_before"] != s1["sha_before"]  # the ranks trained apart on different data
        assert s0["sha_after"] == s1["sha_after"]  # the agreement checksum matches after the sync
        for a, b, avg in zip(s0["before"], s1["before"], s0["after"], strict=True):
            assert torch.equal(avg, a / 2 + b / 2)
        assert s0["bytes"] == numel * 4


@pytest.mark.slow
def test_diloco_outer_step_is_nesterov_sgd_on_the_mean_delta(synced):
    lr, mu, _, _ = SCENARIOS["nesterov"]
    r0, r1 = synced["nesterov"]
    _check_nesterov_by_hand(r0, r1, lr, mu, lambda a, b: a / 2 + b / 2)


def _check_nesterov_by_hand(r0, r1, lr, mu, mean, nbytes=4):
    """Every sync of both ranks against the outer Nesterov step computed by hand on `mean` of the deltas."""
    torch.manual_seed(0)  # both ranks started from this model
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    anchor, buf = [p.detach().clone() for p in m.parameters()], None
    numel = sum(a.numel() for a in anchor)
    for s0, s1 in zip(r0, r1, strict=True):
        assert s0["bytes"] == numel * nbytes
        assert s0["sha_before"] != s1["sha_before"] and s0["sha_after"] == s1["sha_after"]
        # by hand: g = mean over ranks of (anchor - theta_r); b = mu b + g; anchor -= lr (g + mu b)
        g = [mean(a - t0, a - t1) for a, t0, t1 in zip(anchor, s0["before"], s1["before"], strict=True)]
        buf = g if buf is None else [mu * b + gi for b, gi in zip(buf, g, strict=True)]
        want = [a - lr * (gi + mu * b) for a, gi, b in zip(anchor, g, buf, strict=True)]
        for w, got in zip(want, s0["after"], strict=True):
            torch.testing.assert_close(got, w, rtol=1e-6, atol=1e-7)
        anchor = s0["after"]


def _mean_in_16_bits(a, b, dtype):
    """What a 16-bit sync of two ranks computes: each half rounded to 16 bits, summed in 16 bits."""
    return ((a / 2).to(dtype) + (b / 2).to(dtype)).float()


@pytest.mark.slow
@pytest.mark.parametrize("wire, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_a_16_bit_sync_sends_half_the_bytes_and_every_rank_applies_the_same_mean(synced, wire, dtype):
    lr, mu, _, _ = SCENARIOS[f"nesterov-{wire}"]
    r0, r1 = synced[f"nesterov-{wire}"]
    _check_nesterov_by_hand(r0, r1, lr, mu, lambda a, b: _mean_in_16_bits(a, b, dtype), nbytes=2)


@pytest.mark.slow
def test_plain_averaging_in_bf16_moves_the_anchor_by_the_rounded_mean_change(synced):
    r0, r1 = synced["plain-bf16"]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    anchor = [p.detach().clone() for p in m.parameters()]
    for s0, s1 in zip(r0, r1, strict=True):
        assert s0["sha_after"] == s1["sha_after"]
        want = [a - _mean_in_16_bits(a - t0, a - t1, torch.bfloat16)
                for a, t0, t1 in zip(anchor, s0["before"], s1["before"], strict=True)]
        for w, got, t0, t1 in zip(want, s0["after"], s0["before"], s1["before"], strict=True):
            torch.testing.assert_close(got, w, rtol=1e-6, atol=1e-7)
            # the parameters stay fp32 and near the exact average (only the change was rounded)
            assert got.dtype == torch.float32
            torch.testing.assert_close(got, t0 / 2 + t1 / 2, rtol=0, atol=1e-3)
        anchor = s0["after"]


@pytest.mark.slow
def test_a_quantized_sync_applies_the_decoded_mean_on_every_rank_bit_for_bit(synced):
    wire = "int8"  # int4 differs only in the codec (tests/trainer/test_quant_wire.py)
    bits = quant_wire.BITS[wire]
    r0, r1 = synced[f"plain-{wire}"]
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    anchor = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    n = anchor.numel()
    for s0, s1 in zip(r0, r1, strict=True):
        assert s0["sha_before"] != s1["sha_before"] and s0["sha_after"] == s1["sha_after"]
        assert s0["bytes"] == s1["bytes"] == quant_wire.payload_bytes(n, bits)
        t0, t1, got = (torch.cat([t.reshape(-1) for t in s[k]]) for s, k in
                       ((s0, "before"), (s1, "before"), (s0, "after")))
        # by hand: each rank's half of its change, coded and decoded; the anchor moves by their sum
        mean = sum(quant_wire.decode(quant_wire.encode((anchor - t) / 2, bits), n, bits) for t in (t0, t1))
        torch.testing.assert_close(got, anchor - mean, rtol=0, atol=1e-7)
        # within half a quantization step per rank of the exact average
        step = max((anchor - t).abs().max() / 2 / quant_wire.levels(bits) for t in (t0, t1))
        assert (got - (t0 + t1) / 2).abs().max() <= step * 1.001
        anchor = got


# --- 2-rank torchrun runs of the trainer --------------------------------------------------------------

STEPS = 16
ARGS = ["--steps", STEPS, *TINY, "--grad-accum", "2", "--lr", "3e-3", "--sync-every", "4",
        "--allow-local-sgd", "--ckpt-every", "6", "--ckpt-keep", "10"]


@pytest.fixture(scope="module")
def local_run(small_shards, tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "out"
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--check-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ddplab: low-communication mode: 4 local steps per sync, then an outer SGD step" in r.stdout
    return out


@pytest.mark.slow
def test_h4_syncs_every_4_steps_and_ranks_agree_after_each_sync(local_run):
    out = local_run
    n = param_count(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    recs = [read_jsonl(out / f"metrics.rank{r}.jsonl") for r in (0, 1)]
    for rank_recs in recs:
        assert [x["step"] for x in rank_recs if x["synced"]] == [4, 8, 12, 16]
        assert [x["allreduce_bytes"] for x in rank_recs] == [n * 4 if x["synced"] else 0 for x in rank_recs]
        assert all(x["sync_ms"] > 0 for x in rank_recs if x["synced"])
    assert [x["loss"] for x in recs[0]] != [x["loss"] for x in recs[1]]  # each rank its own data
    # --check-every 1 compared the checksum after every sync (a mismatch exits 3); the final one agrees
    s = json.loads((out / "summary.json").read_text())
    assert s["byte_equivalent"] is True and s["sync_every"] == 4
    ls = s["local_sgd"]
    assert (ls["sync_every"], ls["outer_lr"], ls["outer_momentum"], ls["syncs"]) == (4, 0.7, 0.9, 4)
    assert ls["bytes_per_sync"] == n * 4 and ls["comm_bytes_per_step"] == n * 4 / 4
    assert s["allreduce_bytes_per_step"] == n  # the mean per step: a quarter of the parameters' bytes
    # --ckpt-every 6 is not a sync step: its checkpoints moved to the next syncs (8 and 12) and the end
    assert sorted(p.name for p in (out / "ckpt").glob("*.pt")) == [
        "step_000008.pt", "step_000012.pt", "step_000016.pt"]


@pytest.mark.slow
def test_resume_right_after_a_sync_continues_exactly(local_run, small_shards, tmp_path):
    ref = local_run
    out = tmp_path / "out"
    (out / "ckpt").mkdir(parents=True)
    for f in ("step_000008.pt", "step_000008.pt.sha256"):  # the run as it stood after step 8
        shutil.copy(ref / "ckpt" / f, out / "ckpt" / f)
    r = torchrun(["--data", small_shards, "--out", out, *ARGS, "--check-every", "1", "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed from" in r.stdout and "step 8" in r.stdout
    for rank in (0, 1):  # per-rank losses depend on each rank's inner AdamW state and the outer momentum
        want = [(x["step"], x["loss"]) for x in read_jsonl(ref / f"metrics.rank{rank}.jsonl")
                if x["step"] > 8]
        got = [(x["step"], x["loss"]) for x in read_jsonl(out / f"metrics.rank{rank}.jsonl")]
        assert got == want
    s_ref, s = (json.loads((d / "summary.json").read_text()) for d in (ref, out))
    assert s["final_param_sha256"] == s_ref["final_param_sha256"]


@pytest.mark.slow
def test_plain_averaging_trains_under_torchrun(small_shards, tmp_path):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, "--steps", 6, *TINY, "--sync-every", "4",
                  "--allow-local-sgd", "--outer-lr", "1", "--outer-momentum", "0", "--check-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    assert s["byte_equivalent"] is True
    assert (s["local_sgd"]["outer_optimizer"], s["local_sgd"]["syncs"]) == ("none (parameter averaging)", 2)


@pytest.mark.slow
def test_diloco_with_bf16_syncs_trains_under_torchrun_and_the_ranks_agree(small_shards, tmp_path):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, "--steps", 8, *TINY, "--sync-every", "4",
                  "--allow-local-sgd", "--comm", "bf16", "--check-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "MB per sync in bf16" in r.stdout
    s = json.loads((out / "summary.json").read_text())
    n = param_count(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    assert s["byte_equivalent"] is True  # --check-every 1: the checksums agreed after each sync
    ls = s["local_sgd"]
    assert (ls["sync_dtype"], ls["syncs"], ls["bytes_per_sync"]) == ("bf16", 2, n * 2)


@pytest.mark.slow
def test_overlapped_syncs_agree_at_checkpoints_and_the_end_and_resume_exactly(small_shards, tmp_path):
    args = ["--steps", 16, *TINY, "--lr", "3e-3", "--sync-every", "2", "--allow-local-sgd", "--comm", "bf16",
            "--sync-overlap", "--ckpt-every", "8", "--ckpt-keep", "10", "--check-every", "8"]
    ref = tmp_path / "ref"
    r = torchrun(["--data", small_shards, "--out", ref, *args])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "each sync overlaps the next steps and lands one sync late (--sync-overlap)" in r.stdout
    recs = read_jsonl(ref / "metrics.rank0.jsonl")
    # sync points every 2 steps; the ranks agree (a blocking sync) only where a checkpoint/check is due
    assert [x["step"] for x in recs if x["synced"]] == [8, 16]
    assert [x["step"] for x in recs if x["overlapped"]] == [2, 4, 6, 10, 12, 14]
    n = param_count(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    assert all(x["allreduce_bytes"] == n * 2 for x in recs if x["synced"] or x["overlapped"])
    s = json.loads((ref / "summary.json").read_text())
    assert s["byte_equivalent"] is True  # the checksums agreed at steps 8 and 16 (a mismatch exits 3)
    assert (s["local_sgd"]["overlap"], s["local_sgd"]["syncs"]) == (True, 8)
    out = tmp_path / "out"  # resume from the checkpoint at step 8: the same run from there on
    (out / "ckpt").mkdir(parents=True)
    for f in ("step_000008.pt", "step_000008.pt.sha256"):
        shutil.copy(ref / "ckpt" / f, out / "ckpt" / f)
    r = torchrun(["--data", small_shards, "--out", out, *args, "--resume"])
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        want = [(x["step"], x["loss"]) for x in read_jsonl(ref / f"metrics.rank{rank}.jsonl")
                if x["step"] > 8]
        assert [(x["step"], x["loss"]) for x in read_jsonl(out / f"metrics.rank{rank}.jsonl")] == want
    assert json.loads((out / "summary.json").read_text())["final_param_sha256"] == s["final_param_sha256"]


@pytest.mark.slow
def test_a_per_step_warm_up_then_int8_syncs_count_every_byte_sent(small_shards, tmp_path):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, "--steps", 12, *TINY, "--sync-every", "4",
                  "--sync-every-after", "4", "--comm", "int8", "--allow-local-sgd", "--outer-lr", "1",
                  "--outer-momentum", "0", "--check-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "4 steps with a per-step all-reduce (--sync-every-after), then 4 local steps" in r.stdout
    n = param_count(GPTConfig(seq_len=32, n_layer=1, n_embd=64, n_head=1))
    for rank in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert [x["step"] for x in recs if x["synced"]] == [1, 2, 3, 4, 8, 12]
        # DDP's fp32 gradients in the warm-up, then the int8 payload at each sync, nothing in between
        sync = quant_wire.payload_bytes(n, 8)
        assert [x["allreduce_bytes"] for x in recs] == [n * 4] * 4 + [0, 0, 0, sync] * 2
    s = json.loads((out / "summary.json").read_text())
    assert s["byte_equivalent"] is True  # --check-every 1: the checksums agreed after every sync
    ls = s["local_sgd"]
    assert (ls["per_step_until"], ls["syncs"], ls["sync_dtype"]) == (4, 2, "int8")
    assert ls["comm_bytes_per_step"] == (4 * n * 4 + 2 * quant_wire.payload_bytes(n, 8)) / 12
