"""bench/trainer_scaling.py's table: medians with min-max, ratios taken within each round."""

import pytest

from bench.trainer_scaling import rows_from_runs


def runs_of(values):
    return [{"tokens_per_sec": v, "step_ms_p50": 1e3 / v} for v in values]


def test_rows_take_medians_and_ratios_within_each_round():
    runs = {("trainer", 1): runs_of([100, 90, 110]), ("textbook", 1): runs_of([100, 80, 100]),
            ("trainer", 2): runs_of([180, 150, 220]), ("textbook", 2): runs_of([170, 150, 200])}
    rows = {(r["impl"], r["ranks"]): r for r in rows_from_runs(runs)}
    t1 = rows[("trainer", 1)]
    assert t1["tokens_per_sec"] == 100
    assert (t1["tokens_per_sec_spread"]["min"], t1["tokens_per_sec_spread"]["max"]) == (90, 110)
    # round by round 1.0, 1.125, 1.1: the median ratio is not the ratio of the medians (100/100)
    assert t1["vs_textbook"]["median"] == pytest.approx(1.1)
    assert t1["vs_textbook"]["min"] == pytest.approx(1.0) and t1["vs_textbook"]["max"] == pytest.approx(1.125)
    t2 = rows[("trainer", 2)]
    assert t2["speedup_vs_1rank"]["values"] == pytest.approx([1.8, 150 / 90, 2.0])
    assert t2["scaling_efficiency"] == pytest.approx(0.9)
    assert rows[("textbook", 2)]["vs_textbook"]["median"] == 1.0
