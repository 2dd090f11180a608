"""ddplab/status.py: rows, failed-first and --limit semantics, on hand-made node states."""

import json
import subprocess
import sys

from ddplab.status import NOT_ASKED, judge
from tests.helpers.probes import probe
from tests.helpers.user_logs import nanochat_log, write

NODES = {"node0": 0, "node1": 1, "node2": 2}


def state(kind, code=None, t=None, lost_peer=False, step=3, error=None):
    return {"state": kind, "code": code, "code_time": t, "log_time": t, "lost_peer": lost_peer,
            "step": step, "loss": 2.5, "tokens_per_sec": 1000.0, "last_line": f"{kind} {code}",
            "last_lines": [f"{kind} {code}"],
            "error": error}


def doc(states, asked=None):
    return {"run": "run-1", "log_dir": "/lab/runs", "nodes": NODES, "asked": asked or list(NODES),
            "states": states}


def test_a_running_run_has_no_failure():
    v = judge(doc({h: state("running") for h in NODES}))
    assert [r["verdict"] for r in v["nodes"]] == ["running"] * 3
    assert v["failed"] == [] and v["failed_first"] is None
    assert not any(line.startswith("failed first") for line in v["lines"])


def test_the_cause_is_named_before_its_victims_and_earliest_exit_first():
    v = judge(doc({
        "node0": state("exited", 1, t=100.0, lost_peer=True, error="ddplab: error: lost peer node2"),
        "node1": state("exited", 1, t=105.0),
        "node2": state("exited", 1, t=103.0),
    }))
    assert v["failed"] == ["node2", "node1", "node0"]
    assert v["failed_first"] == "node2"
    assert "failed first: node2 (rank 2, failed (exit code 1))" in v["lines"]


def test_an_asked_node_without_state_is_not_answering_and_named_first():
    """A node whose SSH gives no answer (a closed lid, frozen, off) is "not answering", not "failed": its line
    says so, and the ranks that lost it are its victims."""
    v = judge(doc({"node0": state("exited", 1, t=5.0, lost_peer=True), "node1": state("running")}))
    row = v["nodes"][2]
    assert row["verdict"] == "not answering" and v["not_answering"] == ["node2"]
    assert v["failed_first"] == "node2"
    said = [ln for ln in v["lines"] if ln.startswith("not answering: node2 (rank 2): no answer over SSH")]
    assert len(said) == 1 and "asleep (lid closed), frozen" in said[0] and "ddplab_pg_timeout" in said[0]
    assert not any(ln.startswith("failed first") for ln in v["lines"])


def test_a_slurm_job_ended_by_a_lost_node_names_that_node_first():
    """node1 lost power mid-job: Slurm marked it down and ended the job (NODE_FAIL), and with it node0's
    rank, which wrote no exit code. The lost node is the cause, not the rank Slurm ended."""
    ended = {**state("lost", step=4), "job_state": "NODE_FAIL"}
    v = judge({**doc({"node0": ended}), "nodes": {"node0": 0, "node1": 1}})
    verdicts = {r["host"]: r["verdict"] for r in v["nodes"]}
    assert verdicts == {"node0": "failed (no exit code; its Slurm job is NODE_FAIL)",
                        "node1": "not answering"}
    assert v["failed"] == ["node1", "node0"] and v["failed_first"] == "node1"


def test_limit_marks_left_out_nodes_not_asked_never_not_answering():
    v = judge(doc({"node0": state("running")}, asked=["node0"]))
    verdicts = {r["host"]: r["verdict"] for r in v["nodes"]}
    assert verdicts == {"node0": "running", "node1": NOT_ASKED, "node2": NOT_ASKED}
    assert v["failed_first"] is None and v["left_out"] == ["node1", "node2"]
    assert "not answering" not in "\n".join(v["lines"])
    assert any(ln.startswith("failed first: unknown (node1, node2 not asked") for ln in v["lines"])


def test_limit_with_a_failure_among_the_asked_says_so():
    v = judge(doc({"node1": state("exited", 2, t=1.0)}, asked=["node1"]))
    assert v["failed_first"] == "node1"
    want = "failed first among the nodes asked (node0, node2 not asked): node1 (rank 1, failed (exit code 2))"
    assert want in v["lines"]


def test_stopped_and_finished_are_not_failures():
    states = {"node0": state("stopped"), "node1": state("exited", 0, t=1.0), "node2": state("not-started")}
    v = judge(doc(states))
    assert [r["verdict"] for r in v["nodes"]] == ["stopped (stop.yml)", "finished", "not started"]
    assert v["failed"] == []


def test_cli_reads_stdin_and_rejects_bad_input():
    ok = subprocess.run([sys.executable, "-m", "ddplab", "status"], input=json.dumps(doc({})),
                        capture_output=True, text=True, check=False)
    assert ok.returncode == 0 and json.loads(ok.stdout)["failed_first"] == "node0"
    bad = subprocess.run([sys.executable, "-m", "ddplab", "status"], input="{not json",
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("ddplab: error: status input is not JSON")
    assert "Traceback" not in bad.stderr


def test_a_failed_row_shows_the_exception_its_code_raised():
    crash = {**state("exited", 1, t=2.0), "exception": "FileNotFoundError: [Errno 2] No such file or "
                                                       "directory: 'configurator.py' (train.py:10)"}
    victim = state("exited", 1, t=3.0, lost_peer=True, error="ddplab: error: lost peer rank 0 (node0)")
    finished = {**state("exited", 0, t=1.0), "exception": "ValueError: printed, not raised"}
    v = judge(doc({"node0": crash, "node1": victim, "node2": finished}))
    rows = {line.split()[0]: line for line in v["lines"][1:4]}
    assert rows["node0"].endswith("| FileNotFoundError: [Errno 2] No such file or directory: "
                                  "'configurator.py' (train.py:10)")
    assert rows["node1"].endswith("| ddplab: error: lost peer rank 0 (node0)")
    assert rows["node2"].endswith("| exited 0")  # a finished node shows its last line, never an exception
    assert ("failed first: node0 (rank 0, failed (exit code 1)): FileNotFoundError: [Errno 2] No such file "
            "or directory: 'configurator.py' (train.py:10)") in v["lines"]


def test_your_codes_step_total_and_eta_from_its_printed_lines(tmp_path):
    """The node's run status of code that prints nanochat's lines, judged: step/total and the eta; a node
    whose log has no step line shows `-`, never the built-in trainer's total."""
    run = tmp_path / "run"
    run.mkdir()
    write(run / "launch.log", nanochat_log(num_iterations=20, upto=12))
    master = probe("run-status", "--run-dir", str(run), "--socket", str(tmp_path / "sock"), "--session", "=r")
    master["state"] = "running"  # as with a live tmux pane
    quiet = {**master, "step": None, "total": None, "eta_s": None, "loss": None, "tokens_per_sec": None}
    v = judge(doc({"node0": master, "node1": quiet, "node2": {**master, "state": "exited", "code": 0}}))
    rows = {r["host"]: ln for r, ln in zip(v["nodes"], v["lines"][1:], strict=True)}
    assert "step 11/20 " in rows["node0"] and " eta 0m02s |" in rows["node0"]
    assert "step -      loss -" in rows["node1"] and "/50" not in rows["node1"]
    assert "step 11/20 " in rows["node2"] and "eta" not in rows["node2"]  # finished: no eta
