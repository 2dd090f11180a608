"""nodeprobe/ready.py on a real lab folder: a node is ready only when it recorded these inputs after passing
the checks and nothing it holds changed since; anything else (no record, other inputs, a wiped or edited code
folder, a changed shard, its Python gone, the master port taken) sends the launch back to the checks."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys

import pytest

from nodeprobe import hashing, ready
from tests.helpers.playbooks import REPO

INPUTS = "a" * 64


@pytest.fixture
def lab(tmp_path, monkeypatch):
    """A prepared lab folder: code ddplab placed (with its record), one shard, the Python record."""
    monkeypatch.setenv("DDPLAB_HASH_CACHE", "0")
    root = tmp_path / "ddplab"
    (root / "code" / "trainer").mkdir(parents=True)
    (root / "code" / "trainer" / "train.py").write_text("print('train')\n")
    (root / "code" / hashing.RECORD).write_text(json.dumps({"trainer": ["train.py"]}))
    (root / "data").mkdir()
    (root / "data" / "shard_000.parquet").write_bytes(b"tokens")
    (root / "python").write_text(sys.executable + "\n")
    return root


def ask(root, **spec) -> dict:
    """shared: this machine runs other people's trainers (the suite's other workers)."""
    spec = {"root": str(root), "inputs": INPUTS, "sync_dirs": [], "shared": True, **spec}
    return ready.run(json.dumps(spec))


def test_a_node_that_recorded_these_inputs_and_did_not_change_is_ready(lab):
    assert not ask(lab)["ready"]  # no record yet: checked
    assert ask(lab, write=True)["written"] == str(lab / ready.RECORD)
    got = ask(lab)
    assert got["ready"] and got["why"] == "" and got["home"] == os.path.expanduser("~")
    (lab / "code" / "trainer" / "out.log").write_text("the user's own file: not placed by ddplab\n")
    assert ask(lab)["ready"]


@pytest.mark.parametrize("change,why", [
    (lambda lab: None, "the inputs changed"),
    (lambda lab: (lab / "code" / "trainer" / "train.py").write_text("print('edited')\n"), "its code"),
    (lambda lab: (lab / "data" / "shard_000.parquet").write_bytes(b"other"), "its code, shards"),
    (lambda lab: (lab / "data" / "shard_001.parquet").write_bytes(b"more"), "its code, shards"),
    (lambda lab: (lab / "python").write_text("/nonexistent/python\n"), "sync folders, Python"),
    (lambda lab: shutil.rmtree(lab), "no record"),
])
def test_any_change_since_the_record_sends_the_node_back_to_the_checks(lab, change, why):
    ask(lab, write=True)
    change(lab)
    inputs = "b" * 64 if why == "the inputs changed" else INPUTS
    got = ask(lab, inputs=inputs)
    assert not got["ready"] and why in got["why"], got


def test_the_master_is_not_ready_while_its_port_is_taken(lab):
    ask(lab, write=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert ask(lab, master=False, master_port=port)["ready"]  # a worker does not bind it
        got = ask(lab, master="True", master_port=port)
    assert not got["ready"] and f"the master port {port} is taken" in got["why"]


def test_the_verb_reads_its_spec_on_stdin_and_refuses_one_without_inputs(lab):
    def verb(spec):
        return subprocess.run([sys.executable, "-m", "nodeprobe", "ready"], input=json.dumps(spec), text=True,
                              capture_output=True, cwd=REPO, check=False)
    ok = verb({"root": str(lab), "inputs": INPUTS})
    assert ok.returncode == 0 and json.loads(ok.stdout)["ready"] is False
    bad = verb({"root": str(lab)})
    assert bad.returncode == 2 and "the spec on stdin has no inputs" in bad.stderr


def test_a_firewall_turned_off_since_the_record_sends_the_node_back_to_the_checks(lab, monkeypatch):
    """Closed by default stays closed: a node whose ufw was on when its checks passed and is off now must
    not start a run that skips the firewall check (which refuses a master port open to the LAN)."""
    from nodeprobe import net

    on = {"probe": "firewall", "ufw": True, "ufw_enabled": True, "ufw_input_policy": "DROP",
          "firewalld": False, "firewalld_running": None}
    monkeypatch.setattr(net, "firewall", lambda: on)
    ask(lab, write=True)
    assert ask(lab)["ready"]
    monkeypatch.setattr(net, "firewall", lambda: {**on, "ufw_enabled": False})
    got = ask(lab)
    assert not got["ready"] and "changed since its checks passed" in got["why"]


def test_a_node_where_a_rank_of_the_lab_still_runs_is_checked_again(lab):
    ask(lab, write=True)
    rank = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"],
                            env={**os.environ, "DDPLAB_ROOT": str(lab)}, stdout=subprocess.PIPE, text=True)
    try:
        # Popen may return before the kernel has set the new program's /proc cmdline and environ (vfork
        # resumes the parent mid-exec; CI saw the probe read them empty once): ask once the rank runs.
        assert rank.stdout.readline() == "up\n"
        got = ask(lab)
    finally:
        rank.kill()
        rank.wait()
    assert not got["ready"] and got["why"] == "a rank of the lab runs"
