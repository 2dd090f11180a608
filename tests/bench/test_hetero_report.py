"""bench/hetero.py's summary: the ratios to the sum of the solos are taken within each round, on hand-made
rounds whose answers are worked out here by hand (not by the same formulas)."""

import argparse
import json

import pytest

from bench import hetero


def run(config, rnd, tps, val=2.5, throttled=None, shares=None, hosts=("node0", "node1", "node2")):
    ranks = [{"host": h, "tokens_per_sec": tps, "step_ms_p50": 100.0, "compute_ms_p50": 80.0,
              "wait_ms_p50": 20.0, "share_last": 32} for h in hosts]
    return {"config": config, "round": rnd, "tokens_per_sec": tps, "step_ms_p50": 100.0, "wall_s": 1.0,
            "load_before": [1.0, 1.0, 1.0], "load_after": [2.0, 1.0, 1.0], "throttled": throttled or {},
            "val_loss": val, "ranks": ranks if not config.startswith("solo-") else ranks[:1],
            "balance": {"shares": shares} if shares else None}


def three_host_rounds():
    # round 1: solos 1000 + 1000 + 400 = 2400; uniform 1200 (0.50), balanced 2160 (0.90)
    # round 2: everything 10 % slower (a busier machine): solos 2160;
    #          uniform 1188 (0.55), balanced 2052 (0.95)
    # round 3: solos 1100 + 900 + 400 = 2400; uniform 1440 (0.60), balanced 2040 (0.85)
    out = []
    for rnd, solos, uni, bal in ((1, (1000, 1000, 400), 1200, 2160), (2, (900, 900, 360), 1188, 2052),
                                 (3, (1100, 900, 400), 1440, 2040)):
        for h, t in zip(("node0", "node1", "node2"), solos, strict=True):
            out.append(run(f"solo-{h}", rnd, t, throttled={h: [10, 100]}))
        out.append(run("uniform", rnd, uni, val=2.50, throttled={"node2": [50, 100], "node0": [0, 100]}))
        out.append(run("balanced", rnd, bal, val=2.51, throttled={"node2": [90, 100]}, shares=[40, 40, 16]))
    return out


def args(case="3"):
    return argparse.Namespace(case=case, priority=False, steps=30, warmup=10, balance_every=3)


def test_ratios_are_taken_within_each_round():
    rep = hetero.summarize(three_host_rounds(), args())
    ratios = rep["over_solo_sum"]
    assert ratios["uniform"] == pytest.approx({"median": 0.55, "min": 0.50, "max": 0.60, "n": 3})
    assert ratios["balanced"] == pytest.approx({"median": 0.90, "min": 0.85, "max": 0.95, "n": 3})
    assert rep["balanced_over_solo_sum"] == pytest.approx(0.90)
    # medians of each configuration on their own: node0 1000, node1 900, node2 400; balanced 2052
    assert rep["solo"] == {"node0": 1000, "node1": 900, "node2": 400}
    assert rep["balanced"] == 2052 and rep["uniform"] == 1200
    assert rep["val_loss_balanced_vs_uniform"] == pytest.approx(0.004)
    assert rep["setup"]["rounds"] == 3


def test_throttled_fraction_counts_only_hosts_below_a_core():
    rep = hetero.summarize(three_host_rounds(), args())
    # node2 (21 %): solo 3 x 10/100, uniform 3 x 50/100, balanced 3 x 90/100 -> 450 / 900
    assert rep["throttled_fraction"]["node2"] == pytest.approx(0.5)
    # node0 (60 %): solo 3 x 10/100 and uniform 3 x 0/100 -> 30 / 600
    assert rep["throttled_fraction"]["node0"] == pytest.approx(0.05)


def test_an_incomplete_round_is_left_out_of_the_ratios():
    results = [r for r in three_host_rounds() if not (r["round"] == 3 and r["config"] == "balanced")]
    rep = hetero.summarize(results, args())
    assert rep["over_solo_sum"]["balanced"]["n"] == 2
    assert rep["over_solo_sum"]["balanced"]["median"] == pytest.approx(0.925)


def test_report_files_name_every_host(tmp_path):
    rep = hetero.summarize(three_host_rounds(), args())
    hetero.write_report(tmp_path, rep)
    md = (tmp_path / "report.md").read_text()
    assert "node2 alone (21 %)" in md and "balanced 0.90x (0.85-0.95)" in md
    assert json.loads((tmp_path / "report.json").read_text())["solo"]["node2"] == 400
    assert (tmp_path / "hetero.png").stat().st_size > 1000
