"""--sync-schedule: where the low-communication mode's sync points fall as the learning rate decays
(trainer/sync_schedule.py), the flag's checks, and a 2-rank torchrun run that syncs at those points."""

import json

import pytest
import torch

from tests.helpers.trainer_runs import TINY, read_jsonl, torchrun
from trainer.cli import check_args
from trainer.config import TrainConfig
from trainer.local_sgd import LocalSGD
from trainer.optim import lr_ratio_at
from trainer.sync_schedule import sync_points

BASE = ["--data", "d", "--out", "o"]


def ratio_of(steps: int):
    """The trainer's learning rate over its peak at each 0-based step (5 warm-up steps count as the peak;
    cosine to 0.1 of it), as train.py hands it to LocalSGD."""
    cfg = TrainConfig(data="d", out="o", steps=steps, sync_every=2, allow_local_sgd=True)
    return lambda step: lr_ratio_at(cfg, step)


@pytest.mark.parametrize("steps, every, fragments, warm", [(10, 4, 1, 0), (20, 4, 1, 6), (24, 8, 4, 0),
                                                            (30, 6, 3, 5), (7, 2, 2, 0)])
def test_the_constant_schedule_is_every_h_over_f_steps_and_the_last(steps, every, fragments, warm):
    period = every // fragments
    want = [d for d in range(warm + 1, steps + 1) if (d - warm) % period == 0 or d == steps]
    assert sync_points(steps, every, fragments, warm) == want


def test_qsr_stretches_the_period_with_the_square_of_the_decay():
    # lr/peak at the steps that open a period: 1.0 until step 5, then 0.855 at 10, 0.660 at 13, 0.304 at
    # 18: periods 2, 2, 2, 2, 2, 2/0.855^2 = 2.7 -> 3, 2/0.660^2 = 4.6 -> 5, 2/0.304^2 = 21.6 -> the end
    assert sync_points(24, 2, 1, 0, "qsr", ratio_of(24)) == [2, 4, 6, 8, 10, 13, 18, 24]
    # inverse-lr: 2/0.855 = 2.3 -> 2, 2/0.731 = 2.7 -> 3 at step 12, 2/0.513 = 3.9 -> 4 at 15, 2/0.245 -> 8
    assert sync_points(24, 2, 1, 0, "inverse-lr", ratio_of(24)) == [2, 4, 6, 8, 10, 12, 15, 19, 24]
    constant = sync_points(1600, 8, 1, 0)
    for schedule in ("inverse-lr", "qsr"):  # fewer syncs than constant H, and periods that only grow
        points = sync_points(1600, 8, 1, 0, schedule, ratio_of(1600))
        periods = [b - a for a, b in zip([0, *points], points[:-1], strict=False)]
        assert points[-1] == 1600 and len(points) < len(constant)
        assert periods[0] == 8 and periods == sorted(periods), periods


def test_fragments_take_their_turns_at_the_stretched_points():
    m = LocalSGD([torch.zeros(3), torch.zeros(3)], sync_every=2, steps=24, outer_lr=1.0, outer_momentum=0.0,
                 fragments=2, schedule="qsr", lr_ratio=ratio_of(24))
    due = [d for d in range(1, 25) if m.due(d)]
    assert due == sync_points(24, 2, 2, 0, "qsr", ratio_of(24)) and due[:3] == [1, 2, 3]
    assert [m.fragment_at(d) for d in due] == [(0, 1), (1, 2)] * (len(due) // 2) + [(0, 1)] * (len(due) % 2)


@pytest.mark.parametrize("extra, words", [
    (["--sync-schedule", "qsr"], "add --sync-every H"),
    (["--sync-every", "4", "--allow-local-sgd", "--sync-schedule", "cubic"],
     "one of constant, inverse-lr, qsr"),
])
def test_a_bad_sync_schedule_gives_one_line_naming_the_flag(extra, words):
    line = check_args(BASE + extra)
    assert line is not None and line.startswith("trainer argument --sync-schedule:") and words in line, line


def test_a_sync_schedule_with_local_steps_is_accepted():
    for schedule in ("constant", "inverse-lr", "qsr"):
        assert check_args(BASE + ["--sync-every", "4", "--allow-local-sgd", "--sync-schedule", schedule,
                                  "--sync-fragments", "2", "--sync-overlap"]) is None


@pytest.mark.slow
def test_a_qsr_run_syncs_at_the_stretched_points_and_the_ranks_agree(small_shards, tmp_path):
    out = tmp_path / "out"
    r = torchrun(["--data", small_shards, "--out", out, "--steps", 24, *TINY, "--sync-every", "2",
                  "--sync-schedule", "qsr", "--allow-local-sgd", "--outer-lr", "1", "--outer-momentum", "0",
                  "--check-every", "1"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert "the period stretched as the learning rate decays (qsr): 8 sync points" in r.stdout
    for rank in (0, 1):
        recs = read_jsonl(out / f"metrics.rank{rank}.jsonl")
        assert [x["step"] for x in recs if x["synced"]] == [2, 4, 6, 8, 10, 13, 18, 24]
    s = json.loads((out / "summary.json").read_text())
    assert s["byte_equivalent"] is True  # --check-every 1: the checksums agreed after every sync
    assert (s["local_sgd"]["schedule"], s["local_sgd"]["syncs"]) == ("qsr", 8)
