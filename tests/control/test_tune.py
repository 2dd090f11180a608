"""ddplab tune's table, advice and plot from the lines the runs printed (nanochat's own f-strings,
tests/helpers/user_logs.py; the built-in trainer's progress_line)."""

import json

from ddplab import tune
from nodeprobe import log_metrics as lm
from tests.helpers.user_logs import nanochat_log
from trainer.metrics import progress_line


def records(lines):
    return lm.parse(lines, lm.choose(lines))[0]


def nanochat_records(total_batch_size):
    return [r for r in records(nanochat_log(upto=8, total_batch_size=total_batch_size)) if "loss" in r]


def test_a_layout_row_is_the_median_after_the_first_step_with_its_spread():
    recs = nanochat_records(4096)
    row = tune.layout_figures("1x2", 1, 2, recs)
    tps = [r["tokens_per_sec"] for r in recs[1:]]  # step 0 (warm-up, dt 2 s) is left out
    assert row["tokens_per_sec"] == sorted(tps)[len(tps) // 2]
    assert (row["tokens_per_sec_min"], row["tokens_per_sec_max"]) == (min(tps), max(tps))
    assert row["steps"] == 8 and row["allreduce_share"] is None  # nanochat prints no all-reduce time


def test_the_built_in_trainers_all_reduce_share_is_read_from_its_line():
    lines = [progress_line({"step": s, "loss_mean": 3.0, "lr": 1e-3, "dt_ms": 200.0, "tokens_per_sec": 5000.0,
                            "allreduce_ms": 50.0}, 10, 5.0) for s in range(1, 5)]
    row = tune.layout_figures("all", 2, 1, records(lines))
    assert row["allreduce_share"] == 0.25 and row["tokens_per_sec"] == 5000.0


def test_the_advice_names_the_fastest_layout_and_the_setting(tmp_path):
    rows = [tune.layout_figures("1x1", 1, 1, nanochat_records(2048)),
            tune.layout_figures("1x2", 1, 2, nanochat_records(3072)),
            tune.layout_figures("all", 2, 1, nanochat_records(1024))]
    advice = tune.recommend(rows)
    assert advice.startswith("use 1x2: one node, ddplab_nproc_per_node: 2") and "1.50x" in advice
    rows[2] = tune.layout_figures("all", 2, 1, nanochat_records(8192))
    assert tune.recommend(rows).startswith("use all: every node") and "4.00x" in tune.recommend(rows)
    assert tune.recommend([tune.layout_figures("1x1", 1, 1, [])]).startswith("no layout printed")

    t = {"id": "tune-1", "what": "-m scripts.base_train", "seconds": 60, "master": "node0",
         "nodes": ["node0", "node1"], "rows": rows, "advice": tune.recommend(rows)}
    tune.write(t, tmp_path)
    md = (tmp_path / "tune.md").read_text()
    assert "| all | 2 x 1 | 8 |" in md and "**use all" in md
    assert json.loads((tmp_path / "tune.json").read_text())["rows"][0]["layout"] == "1x1"
    assert (tmp_path / "tune.png").read_bytes()[:4] == b"\x89PNG"
