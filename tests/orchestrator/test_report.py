"""python -m ddplab report on a collected run folder (fast: no Ansible, no torch)."""

import json
import subprocess
import sys

from tests.helpers.playbooks import REPO


def write_rank(d, rank, losses, exit_code=0, summary=None):
    out = d / "out"
    out.mkdir(parents=True)
    (d / "exit_code").write_text(f"{exit_code}\n")
    rows = [{"step": i + 1, "loss": loss, "dt_ms": 100.0 + i, "tokens_per_sec": 1000.0 + rank,
             "allreduce_ms": 5.0} for i, loss in enumerate(losses)]
    (out / f"metrics.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (out / f"summary.rank{rank}.json").write_text(json.dumps({"tokens_per_sec": 1000.0 + rank}))
    if summary is not None:
        (out / "summary.json").write_text(json.dumps(summary))


def run_report(run_dir):
    return subprocess.run([sys.executable, "-m", "ddplab", "report", str(run_dir)], cwd=REPO, text=True,
                          capture_output=True, timeout=120)


def test_report_merges_ranks(tmp_path):
    run = tmp_path / "run-x"
    write_rank(run / "nodeA", 0, [5.0, 4.0, 3.5], summary={"world_size": 2, "byte_equivalent": True})
    write_rank(run / "nodeB", 1, [5.1, 4.1, 3.6], exit_code=1)
    proc = run_report(run)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads((run / "summary.json").read_text())
    assert merged["byte_equivalent"] is True and merged["world_size"] == 2
    assert merged["exit_codes"] == {"nodeA/rank0": 0, "nodeB/rank1": 1}
    assert merged["all_exited_zero"] is False
    assert [r["final_loss"] for r in merged["ranks"]] == [3.5, 3.6]
    table = (run / "report.md").read_text()
    assert "| nodeA | 0 | 0 | 3 | 3.5 |" in table and "| nodeB | 1 | 1 | 3 | 3.6 |" in table
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_without_metrics_is_one_clear_error(tmp_path):
    (tmp_path / "run-y" / "nodeA").mkdir(parents=True)
    proc = run_report(tmp_path / "run-y")
    assert proc.returncode == 2
    assert proc.stderr.startswith("ddplab: error: no metrics.rank*.jsonl") and "Traceback" not in proc.stderr
    assert not (tmp_path / "run-y" / "report.md").exists()
