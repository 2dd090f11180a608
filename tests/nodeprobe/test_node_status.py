"""run-status (roles/launch), route (roles/gloo_network) and torch_candidates (roles/torch_env) on this
machine, as the roles call them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers.probes import REPO, probe
from tests.helpers.user_logs import nanochat_log, write


def test_run_status_of_a_missing_and_an_exited_run(tmp_path):
    gone = probe("run-status", "--run-dir", str(tmp_path / "nope"), "--socket", str(tmp_path / "sock"),
                 "--session", "=nope")
    assert gone["state"] == "not-started" and gone["code"] is None
    run = tmp_path / "run"
    (run / "out").mkdir(parents=True)
    (run / "launch.log").write_text("ddplab: run r1 on node0\nstep 1\nddplab: error: rank 1 lost a peer\n")
    (run / "out" / "metrics.rank0.jsonl").write_text(json.dumps({"step": 3, "loss": 2.5}) + "\n")
    (run / "exit_code").write_text("1\n")
    r = probe("run-status", "--run-dir", str(run), "--socket", str(tmp_path / "sock"), "--session", "=r1")
    assert r["state"] == "exited" and r["code"] == 1 and r["step"] == 3 and r["loss"] == 2.5
    assert r["error"] == "ddplab: error: rank 1 lost a peer" and r["lost_peer"] is True
    (run / "exit_code").unlink()
    assert probe("run-status", "--run-dir", str(run), "--socket", str(tmp_path / "sock"),
                 "--session", "=r1")["state"] == "lost"  # no exit code and no tmux pane


def test_run_status_of_your_own_code_reads_the_lines_it_printed(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write(run / "launch.log", nanochat_log(num_iterations=20, upto=12))
    args = ("run-status", "--run-dir", str(run), "--socket", str(tmp_path / "sock"), "--session", "=r1")
    r = probe(*args, "--total-steps=0")
    assert r["log_format"] == "nanochat" and (r["step"], r["total"]) == (11, 20)
    assert r["loss"] == pytest.approx(9.3) and r["tokens_per_sec"] == int(524288 / 0.261)
    assert r["eta_s"] == pytest.approx(9 * 0.256, rel=0.01)
    assert r["progress"] == "step 11/20 loss 9.3000 2008766 tok/s eta 0m02s"
    custom = probe(*args, r"--log-pattern=^step (?P<step>\d+)/\d+ \(")  # total not captured: step alone
    assert custom["log_format"] == "custom" and custom["step"] == 11 and custom["total"] is None
    assert custom["progress"] == "step 11 loss - - tok/s"
    # the built-in trainer: its metrics line, the steps it was given, the log's lines not read
    (run / "out").mkdir()
    (run / "out" / "metrics.rank0.jsonl").write_text(json.dumps({"step": 3, "loss": 2.5}) + "\n")
    builtin = probe(*args, "--total-steps=50")
    assert (builtin["step"], builtin["total"], builtin["log_format"], builtin["eta_s"]) == (3, 50, None, None)
    assert builtin["progress"] == "step 3/50 loss 2.5000 - tok/s"
    # its own record wins: a status asked without the launch's -e ddplab_trainer_steps=600 still says /600
    (run / "out" / "config.json").write_text(json.dumps({"steps": 600, "depth": 2}))
    recorded = probe(*args, "--total-steps=50")
    assert recorded["total"] == 600 and recorded["progress"] == "step 3/600 loss 2.5000 - tok/s"


def test_route_toward_loopback_and_a_bad_address():
    r = probe("route", "--master", "127.0.0.1")
    assert r["error"] == "" and r["ipv4"] is True and r["iface"] == "lo" and r["src"] == "127.0.0.1"
    bad = probe("route", "--master", "not-an-ip")
    assert "is not an IP address" in bad["error"]


@pytest.mark.slow  # imports torch in a child interpreter
def test_torch_candidates_shipped_alone(tmp_path):
    import torch

    alone = tmp_path / "torch_candidates.py"
    shutil.copy(REPO / "nodeprobe" / "torch_candidates.py", alone)
    # Stray files of the login folder the probe runs from must not stand in for the real packages.
    (tmp_path / "numpy.py").write_text("raise ImportError('a stray numpy.py in the login folder')\n")
    (tmp_path / "platform.py").write_text("raise ImportError('a stray platform.py in the login folder')\n")
    out = subprocess.run([sys.executable, str(alone), "--platform-of", sys.executable, sys.executable,
                          "no-such-python3.99"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": ""})
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)["candidates"]
    assert found == [{"python": sys.executable, "torch": torch.__version__.split("+")[0],
                      "checked": "import"},
                     {"python": "no-such-python3.99", "torch": None, "checked": None}]
    major, minor = sys.version_info[:2]
    assert json.loads(out.stdout)["platform"].startswith(f"{major}.{minor} ")


def test_torch_candidates_stamp_skips_the_import_until_a_package_changes(tmp_path):
    """Stand-in numpy/pyarrow/torch packages (tiny, on PYTHONPATH) so the test is fast; the import
    check, the stat key and the stamp are the real ones."""
    fakes = tmp_path / "site"
    for name in ("numpy", "pyarrow", "torch"):
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text("")
    torch_init = fakes / "torch" / "__init__.py"
    torch_init.write_text("__version__ = '9.9.9+cpu'\n")
    stamp = tmp_path / "lab" / ".torch-checked.json"
    stamp.parent.mkdir()
    env = {**os.environ, "PYTHONPATH": str(fakes)}

    def probe():
        argv = [sys.executable, str(REPO / "nodeprobe" / "torch_candidates.py"), "--stamp", str(stamp),
                sys.executable]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
        return json.loads(out.stdout)["candidates"][0]

    assert probe() == {"python": sys.executable, "torch": "9.9.9", "checked": "import"}
    assert probe() == {"python": sys.executable, "torch": "9.9.9", "checked": "stamp"}
    torch_init.write_text("__version__ = '9.9.8+cpu'\n")  # upgraded: size and mtime change
    assert probe() == {"python": sys.executable, "torch": "9.9.8", "checked": "import"}
    (fakes / "numpy" / "__init__.py").write_text("raise ImportError('damaged')\n")  # no longer imports
    assert probe()["torch"] is None


def test_torch_candidates_torch_only_asks_for_torch_alone(tmp_path):
    """--torch-only (roles/torch_env's check of a user's code venv): a Python with the pinned torch whose
    pyarrow does not import counts; the default check, the built-in trainer's, does not take it. Stand-ins on
    PYTHONPATH, as above."""
    fakes = tmp_path / "site"
    for name, text in (("torch", "__version__ = '9.9.9+cpu'\n"), ("pyarrow", "raise ImportError('none')\n")):
        (fakes / name).mkdir(parents=True)
        (fakes / name / "__init__.py").write_text(text)
    env = {**os.environ, "PYTHONPATH": str(fakes)}

    def probe(*flags):
        argv = [sys.executable, str(REPO / "nodeprobe" / "torch_candidates.py"), *flags, sys.executable]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=True)
        return json.loads(out.stdout)["candidates"][0]["torch"]

    assert (probe(), probe("--torch-only")) == (None, "9.9.9")
