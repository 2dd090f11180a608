"""The embedded local inventory: 2 ranks on this machine, no SSH, no root (what `make demo` runs)."""

import json
import re
import socket
import subprocess

import pytest

from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_local_launch_wait_collects_summary(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")  # each inventory host's lab folder lives under ~/ddplab/
    shards = make_shards(tmp_path_factory.getbasetemp() / "shards")
    runs = tmp_path_factory.mktemp("runs")
    extra = {"ddplab_data_dir": shards, "ddplab_runs_dir": runs, "ddplab_wait": "true",
             "ddplab_trainer_steps": 6, "ddplab_master_port": free_port(), "ddplab_wait_poll": 2,
             "ddplab_run_id": "local-test"}
    env = {"HOME": str(home)}
    proc = playbook("launch.yml", extra=extra, timeout=420, env=env)
    assert proc.returncode == 0, tail(proc)
    assert set(recap(proc)) == {"local0", "local1"}
    run = runs / "local-test"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6
    assert summary["byte_equivalent"] is True
    assert summary["exit_codes"] == {"local0/rank0": 0, "local1/rank1": 0}
    for host in ("local0", "local1"):
        assert (run / host / "pane.txt").read_text().count("ddplab: run local-test") == 1
        assert "exited with code 0" in (run / host / "launch.log").read_text()
    assert "ddplab: done" in (run / "local0" / "launch.log").read_text()
    # Each inventory host got its own lab folder and tmux socket.
    for lab in ("local0", "local1"):
        assert (home / "ddplab" / lab / "runs" / "local-test" / "exit_code").read_text().strip() == "0"
    assert (REPO / "inventory" / "local" / "hosts.yml").exists()

    # status.yml reads the last run without being told its id.
    status = playbook("status.yml", extra={"ddplab_runs_dir": runs}, timeout=120, env=env)
    assert status.returncode == 0, tail(status)
    assert "run local-test" in status.stdout
    assert len(re.findall(r"local\d\s+rank \d+\s+finished\s+step 6\b", status.stdout)) == 2, tail(status)

    # stop.yml closes the finished run's tmux sessions: each lab's tmux server exits, nothing is left.
    stop = playbook("stop.yml", extra={"ddplab_runs_dir": runs}, timeout=120, env=env)
    assert stop.returncode == 0, tail(stop)
    for lab in ("local0", "local1"):
        sock = home / "ddplab" / lab / "tmux.sock"
        alive = subprocess.run(["tmux", "-S", str(sock), "has-session"], capture_output=True, timeout=30)
        assert alive.returncode != 0
    # a run that had finished before the stop is still "finished", not "stopped"
    status = playbook("status.yml", extra={"ddplab_runs_dir": runs}, timeout=120, env=env)
    assert status.returncode == 0, tail(status)
    assert len(re.findall(r"local\d\s+rank \d+\s+finished\s+step 6\b", status.stdout)) == 2, tail(status)
