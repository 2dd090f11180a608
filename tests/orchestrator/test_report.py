"""python -m ddplab report on a collected run folder (fast: no Ansible, no torch)."""

import json
import subprocess
import sys

from ddplab import lowcomm_advice
from tests.helpers.playbooks import REPO
from tests.helpers.user_logs import RUN_LINE, nanochat_log, nanogpt_log, write


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


def run_report(run_dir, *args):
    return subprocess.run([sys.executable, "-m", "ddplab", "report", str(run_dir), *args], cwd=REPO,
                          text=True, capture_output=True, timeout=120)


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


def test_report_shows_each_ranks_share_compute_and_wait(tmp_path):
    run = tmp_path / "run-b"
    for rank, (share, compute, wait) in enumerate([(11, 300.0, 12.0), (5, 290.0, 25.0)]):
        d = run / f"node{rank}" / "out"
        d.mkdir(parents=True)
        (run / f"node{rank}" / "exit_code").write_text("0\n")
        rows = [{"step": i + 1, "loss": 4.0, "dt_ms": 320.0, "tokens_per_sec": 900.0, "allreduce_ms": 30.0,
                 "share": share, "compute_ms": compute + i, "wait_ms": wait, "exposed_ms": wait}
                for i in range(3)]
        (d / f"metrics.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "node0" / "out" / "summary.json").write_text(json.dumps(
        {"world_size": 2, "balance": {"shares": [11, 5], "global_seqs": 16, "changes": [
            {"step": 10, "from": [8, 8], "to": [11, 5], "ms_per_seq": [30.0, 60.0]}]}}))
    proc = run_report(run)
    assert proc.returncode == 0, proc.stderr
    table = (run / "report.md").read_text()
    assert "| share p50 | compute ms p50 | wait ms p50 |" in table
    assert "| 11 | 301 | 12 |" in table and "| 5 | 291 | 25 |" in table
    assert "- balance: shares [11, 5] of 16 sequences per step (1 changes, last at step 10)" in table


def _tgz(path, members):
    import io
    import tarfile

    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o600 if name.endswith(".env") else 0o644
            tar.addfile(info, io.BytesIO(data))


def test_unpack_puts_each_archive_in_its_node_folder_and_keeps_earlier_ones(tmp_path):
    run = tmp_path / "run-u"
    write_rank(run / "nodeA", 0, [5.0, 4.0])  # collected earlier (e.g. another --limit): stays
    _tgz(run / "nodeB.tgz", {"exit_code": b"0\n", "trainer.env": b"SECRET=1\n"})
    out = subprocess.run([sys.executable, "-m", "ddplab", "report", str(run), "--nodes=nodeA,nodeB",
                          "--unpack=nodeB", "--no-report"], cwd=REPO, text=True, capture_output=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert (run / "nodeB" / "exit_code").read_text() == "0\n"
    assert ((run / "nodeB" / "trainer.env").stat().st_mode & 0o777) == 0o600
    assert not (run / "nodeB.tgz").exists() and (run / "nodeA" / "exit_code").exists()
    assert not (run / "report.md").exists()


def test_unpack_refuses_an_archive_that_escapes_its_folder(tmp_path):
    run = tmp_path / "run-v"
    run.mkdir()
    _tgz(run / "nodeB.tgz", {"../../evil": b"x"})
    out = subprocess.run([sys.executable, "-m", "ddplab", "report", str(run), "--unpack=nodeB"], cwd=REPO,
                         text=True, capture_output=True, timeout=120)
    assert out.returncode == 1 and "nodeB's archive" in out.stderr and "'../../evil'" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "evil").exists()


def user_host(d, lines, exit_code=0):
    """A collected host of a run of your own code: its launch.log and exit code, no ddplab metrics."""
    d.mkdir(parents=True)
    write(d / "launch.log", lines + ["ddplab: rank 0 exited with code 0"])
    (d / "exit_code").write_text(f"{exit_code}\n")


def test_report_of_your_code_from_the_lines_it_printed(tmp_path):
    run = tmp_path / "run-n"
    user_host(run / "node0", nanochat_log(num_iterations=20, upto=20))
    user_host(run / "node1", [RUN_LINE, "a worker prints nothing of its progress"])
    proc = run_report(run)
    assert proc.returncode == 0, proc.stderr
    merged = json.loads((run / "summary.json").read_text())
    node0, node1 = merged["ranks"]
    # nanochat counts from 0: its 20 steps end at step 19, the last step it printed (not a count of steps)
    assert (node0["last_step"], node0["final_loss"]) == (19, 8.5)
    # median of steps 1..19 (step 0, the warm-up, left out): tok/sec = int(524288 / (0.25 + s / 1000))
    assert node0["tokens_per_sec"] == int(524288 / 0.26) and node0["step_ms_p50"] == 260.0
    assert node0["allreduce_ms_p50"] is None
    assert node1["last_step"] is None and node1["tokens_per_sec"] is None
    assert merged["last_step"] == 19 and "steps" not in merged
    assert merged["loss_last"] == 8.5 and merged["val_bpb"] == 2.9
    assert merged["tokens_per_sec"] == node0["tokens_per_sec"]  # the sum of the nodes': rank 0 prints it
    assert merged["has_metrics"] is False and merged["has_log_metrics"] is True
    table = (run / "report.md").read_text()
    assert "- metrics_from: launch.log (nanochat lines)" in table and "![loss](loss.png)" in table
    assert "- last_step: 19" in table and "| host | rank | exit | last step | final loss |" in table
    assert f"| node0 | - | 0 | 19 | 8.5 | {int(524288 / 0.26)} | 260 | - |" in table
    assert "| node1 | - | 0 | - | - | - |" in table
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_sums_each_nodes_tokens_per_second_with_a_custom_pattern(tmp_path):
    run = tmp_path / "run-c"
    pattern = r"^ep (?P<step>\d+) loss=(?P<loss>\S+) (?P<tokens_per_sec>[\d,]+) tok/s"
    for host, rate in (("node0", 1000), ("node1", 3000)):
        user_host(run / host, [RUN_LINE] + [f"ep {s} loss={2 - s / 10} {rate + s:,} tok/s" for s in range(5)])
    proc = run_report(run, f"--log-pattern={pattern}")
    assert proc.returncode == 0, proc.stderr
    merged = json.loads((run / "summary.json").read_text())
    assert [r["tokens_per_sec"] for r in merged["ranks"]] == [1002.5, 3002.5]
    assert merged["tokens_per_sec"] == 4005.0 and merged["metrics_from"] == "launch.log (custom lines)"
    bad = run_report(run, "--log-pattern=(?P<iteration>\\d+)")
    assert bad.returncode != 0 and "ddplab_log_pattern has the unknown group name(s) iteration" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_report_of_nanogpt_lines_and_of_the_built_in_trainer_unchanged(tmp_path):
    run = tmp_path / "run-g"
    user_host(run / "node0", nanogpt_log(max_iters=6))
    assert run_report(run).returncode == 0
    merged = json.loads((run / "summary.json").read_text())
    assert merged["last_step"] == 6 and merged["val_loss"] == 3.7 and merged["tokens_per_sec"] > 0
    builtin = tmp_path / "run-b"
    write_rank(builtin / "nodeA", 0, [5.0, 4.0], summary={"world_size": 1})
    (builtin / "nodeA" / "launch.log").write_text("\n".join(nanochat_log(upto=3)) + "\n")  # not read
    assert run_report(builtin).returncode == 0
    merged = json.loads((builtin / "summary.json").read_text())
    assert "metrics_from" not in merged and "has_log_metrics" not in merged
    assert merged["ranks"][0]["last_step"] == 2  # the built-in trainer counts from 1: its 2 steps


def test_a_run_that_waits_on_its_all_reduce_gets_the_low_communication_section(tmp_path):
    """A per-step run whose exposed all-reduce took most of each step: report.md names the settings of the
    long study (bench/results/lowcomm) to try, summary.json holds them; a compute-bound run gets none."""
    timing = {"world_size": 2, "local_sgd": None, "params": 459008, "step_ms_p50": 100.0}
    for name, exposed in (("run-slow-link", 70.0), ("run-fast-link", 5.0)):
        run = tmp_path / name
        write_rank(run / "nodeA", 0, [5.0, 4.0], summary={**timing, "exposed_ms_p50": exposed})
        write_rank(run / "nodeB", 1, [5.1, 4.1])
        proc = run_report(run)
        assert proc.returncode == 0, proc.stderr
        merged = json.loads((run / "summary.json").read_text())
        text = (run / "report.md").read_text()
        if exposed == 70.0:
            study = lowcomm_advice.load_study()
            best = study["modes"][study["targets"][0]["best_mode"]]
            assert "## Communication" in text and f"`{' '.join(best['flags'])}`" in text
            assert [o["mode"] for o in merged["lowcomm_advice"]["options"]] == \
                [t["best_mode"] for t in study["targets"]]
        else:
            assert "## Communication" not in text and "lowcomm_advice" not in merged
