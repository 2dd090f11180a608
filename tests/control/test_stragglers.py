"""The straggler rule (trainer/straggler_rule.py) on real rank metrics: the run status and the report name a
rank that computes far slower than the others, with ddplab_balance and the governor fix suggested, and say
nothing for two ranks of equal speed.

straggler_runs/ holds two real 20-step runs of the built-in trainer on 2 torchrun nodes, as collected
(<case>/node<R>/out/): slow/ with node1 in a cpu cgroup at 5 % of a core, even/ without a limit
(straggler_runs/record.sh says how they were recorded).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ddplab import report, status
from nodeprobe.run_status import run_status
from trainer.straggler_rule import RATIO, named, per_sequence

RUNS = Path(__file__).with_name("straggler_runs")
GOVERNOR_FIX = "sudo cpupower frequency-set -g performance"


def node_states(case: str, tmp_path: Path) -> dict:
    """Each node's real run status (nodeprobe run-status) on a run folder holding its recorded out/."""
    states = {}
    for node in ("node0", "node1"):
        run_dir = tmp_path / node / "run-1"
        shutil.copytree(RUNS / case / node, run_dir)
        states[node] = run_status(str(run_dir), str(tmp_path / "no-tmux.sock"), "=run-1")
    return states


def test_the_rule_on_the_recorded_medians():
    rows = {case: {n: per_sequence(report._read_jsonl(next((RUNS / case / n).rglob("metrics.rank*.jsonl"))))
                   for n in ("node0", "node1")} for case in ("slow", "even")}
    assert rows["slow"]["node1"] / rows["slow"]["node0"] > RATIO  # recorded at 5 % of a core: ~3.5x
    assert set(named(rows["slow"])) == {"node1"}
    assert named(rows["even"]) == {}  # 1.1x: the noise of two ranks on one loaded machine
    assert named({"node0": 10.0, "node1": None}) == {}  # one figure: nothing to compare


@pytest.mark.parametrize("case", ["slow", "even"])
def test_status_names_the_straggler(case, tmp_path):
    states = node_states(case, tmp_path)
    assert states["node1"]["speed"]["1"]["steps"] == 19  # the newest steps, step 1 (warm-up) left out
    v = status.judge({"run": "run-1", "log_dir": "~/ddplab/runs", "nodes": {"node0": 0, "node1": 1},
                      "asked": ["node0", "node1"], "states": states})
    lines = [ln for ln in v["lines"] if ln.startswith("straggler:")]
    if case == "even":
        assert v["stragglers"] == [] and lines == []
        return
    assert [(s["host"], s["rank"]) for s in v["stragglers"]] == [("node1", 1)]
    assert v["stragglers"][0]["times"] > RATIO and len(lines) == 1
    assert lines[0].startswith("straggler: node1 (rank 1) computes ")
    assert "ddplab_balance: true" in lines[0] and GOVERNOR_FIX in lines[0]


@pytest.mark.parametrize("case", ["slow", "even"])
def test_report_names_the_straggler(case, tmp_path):
    run_dir = tmp_path / "run-1"
    shutil.copytree(RUNS / case, run_dir)
    md = report.write_report(run_dir)
    said = [ln for ln in md.splitlines() if ln.startswith("- straggler:")]
    summary = (run_dir / "summary.json").read_text()
    if case == "even":
        assert said == [] and '"stragglers"' not in summary
        return
    assert len(said) == 1 and said[0].startswith("- straggler: node1 (rank 1) computed ")
    assert "set ddplab_balance: true" in said[0] and GOVERNOR_FIX in said[0]
    assert '"stragglers"' in summary
