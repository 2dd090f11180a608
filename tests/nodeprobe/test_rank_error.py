"""nodeprobe/rank_error.py: the one line that says why a rank failed, from real torchrun logs.

rank_logs/*.log are torchrun 2.13 outputs recorded on this machine (paths rewritten to a node's), each
after an earlier attempt's lines and launch.sh's `ddplab: run` line, as launch.log holds them.
"""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from nodeprobe.rank_error import exception_line, log_exception

LOGS = Path(__file__).parent / "rank_logs"
REPO = Path(__file__).resolve().parents[2]


def test_the_worker_exception_not_torchruns_child_failed_error():
    line = log_exception(str(LOGS / "configurator.log"))
    assert line == ("FileNotFoundError: [Errno 2] No such file or directory: 'configurator.py' (train.py:3)")


def test_the_root_cause_block_of_a_recorded_error():
    assert log_exception(str(LOGS / "record.log")) == "ValueError: bad thing happened (rec.py:4)"


def test_a_killed_rank_names_the_signal():
    assert log_exception(str(LOGS / "sigkill.log")) == "Signal 9 (SIGKILL) received by PID 17006"


def test_an_exit_code_without_exception_gives_none_even_when_output_looks_like_one():
    # the script printed "ValueError: looks like one but is output" and called sys.exit(3)
    assert log_exception(str(LOGS / "exit3.log")) is None


def test_an_earlier_attempt_is_ignored_and_a_missing_log_is_none(tmp_path):
    lines = (LOGS / "exit3.log").read_text().splitlines()
    assert any("from an earlier attempt" in ln for ln in lines)
    assert exception_line(lines) is None
    assert log_exception(str(tmp_path / "absent.log")) is None


def test_interleaved_ranks_give_the_earliest_failure_and_chains_the_last_exception():
    lines = [
        "ddplab: run run-2 rank 0/1 on node0 master 10.77.0.10:29500 iface lab0 threads 1",
        "[rank1]: Traceback (most recent call last):",
        "[rank0]: Traceback (most recent call last):",
        '[rank1]:   File "/root/ddplab/code/user/data.py", line 40, in load',
        "[rank1]:     return int(meta['vocab'])",
        "[rank1]: KeyError: 'vocab'",
        "[rank1]: ",
        "[rank1]: During handling of the above exception, another exception occurred:",
        "[rank1]: ",
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "/root/ddplab/code/user/train.py", line 12, in <module>',
        "[rank1]:     raise SystemExit('no vocab in meta.pkl')",
        "[rank1]: SystemExit: no vocab in meta.pkl",
        '[rank0]:   File "/root/ddplab/code/user/train.py", line 80, in <module>',
        "[rank0]:     loss.backward()",
        "[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed",
    ]
    assert exception_line(lines) == "SystemExit: no vocab in meta.pkl (train.py:12)"


def test_a_gloo_abort_gives_its_what_line():
    lines = ["terminate called after throwing an instance of 'gloo::EnforceNotMet'",
             "  what():  [enforce fail at pair.cc:446] op.preamble.length <= op.nbytes. 8 vs 4",
             "ddplab: rank 0 exited with code 134"]
    assert exception_line(lines) == lines[1].strip()


def test_run_status_names_the_exception_of_a_failed_rank_only(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    shutil.copy(LOGS / "configurator.log", run / "launch.log")
    (run / "exit_code").write_text("1\n")

    def status():
        out = subprocess.run([sys.executable, "-m", "nodeprobe", "run-status", "--run-dir", str(run),
                              "--socket", str(tmp_path / "sock"), "--session", "=run-1"],
                             capture_output=True, text=True, timeout=60, check=True, cwd=REPO)
        return json.loads(out.stdout)

    failed = status()
    assert failed["state"] == "exited" and failed["code"] == 1
    assert failed["exception"] == log_exception(str(run / "launch.log"))
    assert failed["exception"].startswith("FileNotFoundError: ")
    (run / "exit_code").write_text("0\n")
    assert status()["exception"] is None  # a rank that finished has no "why"
