"""The launch's decision from a smoke run (ddplab/smoke_verdict.py) when the smoke run could not judge, was
remembered, or did not run: the scan's errors refuse only when the smoke run gave no verdict. The
verdicts on real runs are tested in tests/nodeprobe/test_code_smoke.py."""

import json
from pathlib import Path

from ddplab.code_check import check
from ddplab.smoke_verdict import decide, node_output

FIXTURES = Path(__file__).resolve().parents[1] / "nodeprobe" / "smoke_fixtures"
TIMED_OUT = {"verdict": "inconclusive", "seconds": 90.2, "problems": [],
             "note": "no rank made an optimizer step within 90 s; nothing was judged"}


def scan(entry: str):
    return check(str(FIXTURES), entry)["findings"]


def test_no_verdict_lets_the_scans_errors_refuse():
    findings = scan("false_alarm.py")
    assert any(f.severity == "error" for f in findings)
    code, lines = decide(TIMED_OUT, "node0", "false_alarm.py", findings)
    assert code == 1
    assert lines[0].startswith("ddplab: warning: the smoke run of false_alarm.py on node0")
    assert any(ln.startswith("ddplab: error: false_alarm.py:") for ln in lines)
    assert "ddplab_smoke_seconds" in lines[-1]


def test_no_verdict_and_a_clean_scan_let_the_ranks_start():
    code, lines = decide(TIMED_OUT, "node0", "good_ddp.py", scan("good_ddp.py"))
    assert code == 0 and "could not judge" in lines[0]


def test_a_remembered_pass_is_said():
    code, lines = decide({"verdict": "cached", "problems": []}, "node0", "good_ddp.py", [])
    assert code == 0 and "passed before" in lines[0]


def test_a_smoke_run_that_did_not_run_refuses_naming_the_node():
    code, lines = decide({"error": "RuntimeError: /x/smoke exists and is not ddplab's smoke folder"},
                         "node0", "good_ddp.py", [])
    assert code == 1 and "on node0" in lines[0] and "is not ddplab's smoke folder" in lines[0]


def test_a_missing_gpu_only_package_is_not_to_be_installed():
    """A missing triton: the scan's patch (do without it), not ddplab_pip_requirements."""
    from ddplab.cpu_patterns import Finding

    found = Finding("train.py", 3, "cuda-import", "warning", "import triton needs a CUDA-only package",
                    "the CPU wheel does not bring triton", "try: import triton / except ImportError: ...")
    result = {"verdict": "fail", "seconds": 5, "problems": [
        {"kind": "missing-module", "module": "triton", "rank": 0, "where": "train.py:3",
         "what": "rank 0 raised ModuleNotFoundError: No module named 'triton'", "fix": "install ..."}]}
    code, lines = decide(result, "node0", "train.py", [found])
    assert code == 1
    assert "at train.py:3; patch: triton needs a GPU, do without it on CPU; the CPU check: train.py:3: " \
        "import triton needs a CUDA-only package; patch: try: import triton" in lines[0]


def passed(ran: dict, **extra) -> dict:
    return {"verdict": "pass", "seconds": 20, "problems": [], "ranks": [], "ran": ran, **extra}


def test_a_scan_error_is_contradicted_only_where_its_line_ran():
    """eval_after_training.py's `.to(0)` (line 13) is a scan error: a smoke run that stopped before the
    evaluation leaves it standing (a warning naming ddplab_smoke_args); one that ran the line contradicts
    it."""
    findings = scan("eval_after_training.py")
    (error,) = [f for f in findings if f.severity == "error"]
    assert (error.path, error.line) == ("eval_after_training.py", 13)
    code, lines = decide(passed({"eval_after_training.py": "1,4,6-8,11,18-30"}), "node0",
                         "eval_after_training.py", findings)
    assert code == 0 and "contradicted" not in "\n".join(lines)
    assert lines[1].startswith("ddplab: warning: eval_after_training.py:13 (torch.randn(4, 8).to(0) moves to "
                               "a device ordinal) never ran in the smoke run: the CPU check's error stands")
    assert "ddplab_smoke_args runs the whole script" in lines[1]
    code, lines = decide(passed({"eval_after_training.py": "1-36"}), "node0", "eval_after_training.py",
                         findings)
    assert code == 0 and lines[1].startswith("ddplab: note: the CPU check's guess eval_after_training.py:13 ")
    assert lines[1].endswith("is contradicted: the smoke run ran that line")


def test_an_early_exit_without_sys_exit_is_placed_at_the_scans_guard_that_ran():
    """A script that returns when it finds no GPU exits 0 with no sys.exit line of its own: the refusal names
    the scan's guard, when that line ran."""
    from ddplab.cpu_patterns import Finding

    guard = Finding("example.py", 98, "cuda-required", "error", "torch.cuda.device_count() < 2 stops the "
                    "program", "every rank stops (exit 0: nothing trains)", "drop the check on CPU")
    result = {"verdict": "fail", "seconds": 5, "ranks": [], "ran": {"example.py": "1-20,95-99"},
              "problems": [{"kind": "no-training", "rank": None, "where": None, "what": "the ranks exited 0 "
                            "without an optimizer step", "fix": "check the arguments"}]}
    code, lines = decide(result, "node0", "example.py", [guard])
    assert code == 1
    assert ("without an optimizer step at example.py:98 (the CPU check's place); patch: check the arguments"
            in lines[0])


def test_the_task_result_gives_the_runs_json_or_what_a_failed_run_printed():
    ran = {"rc": 0, "stdout": '{"verdict": "pass"}', "stderr": ""}
    assert json.loads(node_output(ran)) == {"verdict": "pass"}
    crashed = {"rc": 1, "stdout": "", "stderr": "Traceback ... ModuleNotFoundError: torch"}
    assert json.loads(node_output(crashed)) == {"error": "Traceback ... ModuleNotFoundError: torch"}
    assert json.loads(node_output({"msg": "unreachable"})) == {"error": "unreachable"}
    code, lines = decide(json.loads(node_output(crashed)), "node0", "train.py", [])
    assert code == 1 and "ModuleNotFoundError: torch" in lines[0] and "node0" in lines[0]
