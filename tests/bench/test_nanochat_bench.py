"""bench/nanochat_rounds.py and bench/nanochat_compile_race.py: their figures from what the launches gave."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import docs_tables  # noqa: E402
import nanochat_compile_race as race  # noqa: E402
import nanochat_rounds as rounds  # noqa: E402


def steps(*tps: float) -> list[dict]:
    return [{"step": k, "tokens_per_sec": t, "dt_ms": 1024 / t * 1000} for k, t in enumerate(tps)]


def test_rounds_alternate_which_mode_goes_first():
    assert [rounds.order(k) for k in (1, 2, 3)] == [("eager", "compiled"), ("compiled", "eager"),
                                                     ("eager", "compiled")]


def test_a_launch_counts_its_steps_after_the_warm_up_only():
    row = rounds.round_figures([{"step": 0, "val_bpb": 3.1}, *steps(20, 900, 1000, 1100, 1300)], 2, "ran")
    assert (row["steps"], row["steady_steps"], row["tokens_per_sec"]) == (5, 3, 1100)
    assert (row["tokens_per_sec_min"], row["tokens_per_sec_max"]) == (1000, 1300)
    assert row["first_step_ms"] == 1024 / 20 * 1000  # the compile, when the cache lacked it


def test_compiled_is_set_against_the_eager_launch_of_its_own_round():
    got = [{"round": 1, "mode": "eager", "tokens_per_sec": 1000, "load": [10, 12], "smoke_run": True,
            "wall_s": 200},
           {"round": 1, "mode": "compiled", "tokens_per_sec": 1500, "load": [12, 14]},
           {"round": 2, "mode": "compiled", "tokens_per_sec": 1000, "load": [20, 22]},
           {"round": 2, "mode": "eager", "tokens_per_sec": 800, "load": [22, 18]},
           {"round": 3, "mode": "eager", "tokens_per_sec": None, "load": [5, 5]}]  # a failed launch
    s = rounds.summary(got)
    assert s["eager"] == {"rounds": 2, "median": 900, "min": 800, "max": 1000, "load_min": 5, "load_max": 22}
    assert s["ratio"] == {"median": 1.375, "min": 1.25, "max": 1.5, "n": 2}
    rep = {"iterations": 60, "skip": 2, "summary": s, "tokens_per_step": 1024,
           "warmup": {"wall_s": 700, "load": [3, 9]}, "rounds": [{"first_step_ms": 4000.0, **r} for r in got]}
    table = "\n".join(docs_tables.nanochat_rounds(rep))
    assert "| tokens/s, median of 2 / 2 rounds [min-max] | 900 [800-1,000] | 1,250 [1,000-1,500] |" in table
    assert "| each round (load at its start) | 1,000 (10), 800 (22), - (5) | 1,500 (12), 1,000 (20) |" \
        in table
    assert "| compiled / eager, round by round | | 1.38x [1.25-1.50] |" in table
    # the cold launch (the warm-up) against the eager launch with the smoke run: 500 s more, repaid at
    # 1024/900 - 1024/1250 = 0.32 s a step
    assert "| a launch with the smoke run, wall (s) (load) | 200 (10 to 12) | 700 (3 to 9), cold" in table
    assert "| the cold launch's 500 s more, repaid at the medians' 0.32 s a step | | after 1,569 steps |" \
        in table
    rep["summary"]["compiled"]["median"] = 800
    assert "| the cold launch's 500 s more, repaid | | never: at the medians, compiled is slower |" in \
        "\n".join(docs_tables.nanochat_rounds(rep))


def test_the_race_table_counts_failed_attempts_per_arm():
    got = [{"arm": "own", "rc": 0, "seconds": 100.0, "libraries": 30, "load": [10, 12]},
           {"arm": "shared", "rc": 1, "seconds": 80.0, "libraries": 14, "load": [12, 9]},
           {"arm": "shared", "rc": 0, "seconds": 90.0, "libraries": 15, "load": [9, 11]}]
    assert race.table(got).splitlines()[2:] == ["| own | 0 / 1 | 100 [100-100] | 30 | 10 to 12 |",
                                                "| shared | 1 / 2 | 90 [80-90] | 14-15 | 9 to 12 |"]
