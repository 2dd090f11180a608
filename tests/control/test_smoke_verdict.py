"""The launch's decision from a smoke run (ddplab/smoke_verdict.py) when the smoke run could not judge, was
remembered, or did not run: the scan's errors refuse only when the smoke run gave no verdict. The
verdicts on real runs are tested in tests/nodeprobe/test_code_smoke.py."""

from pathlib import Path

from ddplab.code_check import check
from ddplab.smoke_verdict import decide

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
