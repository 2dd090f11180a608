"""ddplab/plan.py: the settings checked first, then one plan per command (which steps run on which hosts).

In Python, no Ansible: the steps launch.yml runs on a lab as it is, after a failed preflight, with a
requirements file, behind a queued Slurm run of this lab (and not behind another lab's or another user's),
the --limit refused for a run, and bad settings stopping before any plan is printed. The plays read the plan
as it comes out of `python -m ddplab plan` (one JSON object)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ddplab import plan
from ddplab.errors import DdplabError
from tests.helpers.playbooks import REPO

NODES = ["node0", "node1"]


def inv(play_hosts=NODES, **given):
    """validate's input for a 2-node lab, the settings of -e `given` on both nodes."""
    hosts = {h: {"vars": {"ddplab_node_rank": r, **given}, "ansible_host": f"10.9.0.{10 + r}"}
             for r, h in enumerate(NODES)}
    return {"groups": {"ddplab_nodes": NODES, "ddplab_master": NODES[:1], "ddplab_workers": NODES[1:]},
            "play_hosts": play_hosts, "hosts": hosts, "playbook_dir": str(REPO / "playbooks")}


def test_a_relaunch_plans_checks_start_and_the_wait_but_no_prepare():
    p = plan.decide(inv(ddplab_wait=True), "launch")
    assert p["steps"]["preflight"] == p["steps"]["start"] == p["steps"]["collect"] == NODES
    assert p["steps"]["prepare"] == p["steps"]["check"] == [] and not p["ask_queue"]
    assert plan.after_verdict(p, 0)["steps"] == p["steps"]
    assert plan.decide(inv(), "launch")["steps"]["collect"] == []  # no wait: nothing to collect


def test_a_failed_preflight_prepares_and_checks_every_node_again():
    p = plan.after_verdict(plan.decide(inv(), "launch"), 1)
    assert p["steps"]["prepare"] == p["steps"]["check"] == NODES


def test_a_requirements_file_or_ddplab_prepare_always_is_always_prepared(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("tqdm\n")
    for given in ({"ddplab_pip_requirements": str(req)}, {"ddplab_prepare_always": True}):
        p = plan.decide(inv(**given), "launch")
        assert p["steps"]["prepare"] == p["steps"]["check"] == NODES, given


def test_a_new_run_id_for_launch_and_start_the_given_one_kept_and_the_last_one_read_elsewhere():
    a, b = plan.decide(inv(), "launch")["run_id"], plan.decide(inv(), "start")["run_id"]
    assert a != b and a.startswith("run-") and len(a) == len("run-20260101-120000-abcdef")
    assert plan.decide(inv(ddplab_run_id="run-7"), "launch")["run_id"] == "run-7"
    assert plan.decide(inv(), "status")["run_id"] == ""  # the master's last run, read by run_id.yml


def test_a_limit_that_leaves_out_a_node_of_the_run_is_refused_for_launch_only():
    with pytest.raises(DdplabError, match=r"--limit leaves out node1: a run trains on every node"):
        plan.decide(inv(play_hosts=["node0"]), "launch")
    assert plan.decide(inv(play_hosts=["node0"]), "prepare")["steps"] == {"prepare": ["node0"]}
    rejoin = inv(play_hosts=["node1"], ddplab_elastic=True, ddplab_run_id="run-1")
    assert plan.decide(rejoin, "start")["steps"] == {"start": ["node1"]}  # a node back into an elastic run


def test_slurm_asks_the_queue_and_a_queued_run_of_this_lab_leaves_the_nodes_as_they_are():
    p = plan.decide(inv(ddplab_scheduler="slurm"), "launch")
    assert p["ask_queue"]
    others = ["11|RUNNING|None|ddplab-ffffffff-run-1", "12|PENDING|None|train-big"]
    assert plan.after_queue(p, others, "ddplab-3f9a1c2b-")["steps"] == p["steps"]
    busy = plan.after_queue(p, [*others, "13|PENDING|Resources|ddplab-3f9a1c2b-run-2"], "ddplab-3f9a1c2b-")
    assert busy["steps"]["preflight"] == busy["steps"]["prepare"] == [] and busy["steps"]["start"] == NODES
    assert busy["queue_jobs"] == ["13|PENDING|Resources|ddplab-3f9a1c2b-run-2"] and not busy["ask_queue"]
    assert plan.after_verdict(busy, 1)["steps"]["prepare"] == []  # nothing prepared under a live run


def run_verb(data: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddplab", "plan", "--offline"], input=json.dumps(data),
                          capture_output=True, text=True, cwd=REPO, check=False)


def test_bad_settings_stop_before_any_plan_and_a_good_one_prints_it():
    bad = run_verb({**inv(ddplab_trainer_stpes=3), "command": "launch"})
    assert bad.returncode == 2 and bad.stdout == ""
    assert "ddplab: error: ddplab_trainer_stpes (all)" in bad.stderr and "Traceback" not in bad.stderr
    good = run_verb({**inv(), "command": "status"})
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["steps"] == {"status": NODES}
    step = run_verb({"plan": json.loads(good.stdout) | {"steps": {"prepare_on_fail": NODES}}, "verdict": 1})
    assert json.loads(step.stdout)["steps"]["prepare"] == NODES


def ready(answer: bool, why: str = "") -> dict:
    """A node's registered `nodeprobe ready` task."""
    return {"rc": 0, "stdout": json.dumps({"probe": "ready", "ready": answer, "why": why, "home": "/root"})}


def test_a_relaunch_whose_every_node_passed_with_these_inputs_neither_checks_nor_prepares():
    p = plan.decide(inv(ddplab_wait=True), "launch")
    assert p["ask_ready"] and len(p["inputs"]) == 64
    skip = plan.after_ready(p, {h: ready(True) for h in NODES})
    assert skip["steps"]["preflight"] == skip["steps"]["prepare"] == skip["steps"]["check"] == []
    assert skip["steps"]["start"] == skip["steps"]["collect"] == NODES and not skip["ask_ready"]
    assert plan.after_verdict(skip, 1)["steps"]["prepare"] == []  # no verdict comes: nothing was checked


@pytest.mark.parametrize("node1", [
    ready(False, "no record of passed checks in /root/ddplab"), {"unreachable": True, "msg": "timed out"},
    {"rc": 0, "stdout": json.dumps({"probe": "ready"})}, None,
    {"rc": 3, "stdout": "", "stderr": "ddplab: error: no ~/ddplab/code/nodeprobe: the node is not prepared"},
])
def test_one_node_not_ready_or_silent_keeps_the_checks_on_every_node(node1):
    p = plan.decide(inv(ddplab_wait=True), "launch")
    kept = plan.after_ready(p, {"node0": ready(True), "node1": node1})
    assert kept["steps"] == p["steps"] and not kept["ask_ready"]
    assert plan.after_verdict(kept, 1)["steps"]["prepare"] == NODES  # a failed check still prepares


def test_the_nodes_are_not_asked_when_prepare_runs_anyway_under_slurm_nor_for_another_command(tmp_path):
    assert not plan.decide(inv(ddplab_prepare_always=True), "launch")["ask_ready"]
    assert not plan.decide(inv(ddplab_scheduler="slurm"), "launch")["ask_ready"]  # slurmd may have stopped
    for command in ("prepare", "preflight", "start", "status"):
        assert not plan.decide(inv(), command)["ask_ready"], command


def test_the_input_fingerprint_follows_what_the_checks_and_prepare_read(tmp_path):
    """A changed torch pin, address, setting prepare reads, shard set or code of yours gives another
    fingerprint (the nodes are checked again); another run id, step count or wait does not."""
    def fp(lab=None, **given):
        return plan.decide(lab or inv(**given), "launch")["inputs"]

    shards = tmp_path / "shards"
    shards.mkdir()
    (shards / "manifest.json").write_text('{"files": []}')
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    base = fp(ddplab_data_dir=str(shards))
    assert fp(ddplab_data_dir=str(shards), ddplab_run_id="run-9", ddplab_trainer_steps=7,
              ddplab_wait=True) == base
    moved = inv(ddplab_data_dir=str(shards))
    moved["hosts"]["node1"]["ansible_host"] = "10.9.0.99"
    changed = [fp(ddplab_data_dir=str(shards), ddplab_torch_version="2.12.0"), fp(moved),
               fp(ddplab_data_dir=str(shards), ddplab_master_port=29700),
               fp(ddplab_data_dir=str(shards), ddplab_trainer_depth=4)]
    (shards / "manifest.json").write_text('{"files": [], "digest": "x"}')
    changed.append(fp(ddplab_data_dir=str(shards)))
    mine = fp(ddplab_code_dir=str(code), ddplab_entrypoint="train.py")
    (code / "train.py").write_text("print(2)\n")
    assert fp(ddplab_code_dir=str(code), ddplab_entrypoint="train.py") != mine
    assert base not in changed and len(set(changed)) == len(changed)
