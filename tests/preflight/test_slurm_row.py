"""Preflight's slurm row (ddplab_scheduler slurm), judged by the verdict on a dump folder from the Slurm
probe's facts (nodeprobe/slurm_node.py; on a real Slurm cluster: tests/stock/test_slurm.py)."""

from __future__ import annotations

import pytest

from nodeprobe import slurm_node
from tests.nodeprobe.test_verdict import cluster, failing, real, run_verdict  # noqa: F401

SETUP = "run playbooks/slurm.yml"


def healthy(name: str, controller: bool) -> dict:
    return {"ok": True, "name": name, "missing": [],
            "daemons": {"munged": True, "slurmd": True, "slurmctld": controller},
            "munge": {"ok": True, "error": ""}, "sinfo": {"ok": True, "state": "idle", "error": ""},
            "owner": {"uid": 1000, "user": "lab", "gid": 1000, "group": "lab"}}


@pytest.fixture
def slurm_lab(real):  # noqa: F811
    files = cluster(real, 2)
    files["inventory.json"].update(scheduler="slurm", slurm_controller="node0")
    for i, h in enumerate(("node0", "node1")):
        files[f"{h}/slurm.json"] = healthy(h, controller=i == 0)
    return files


def test_without_slurm_the_row_is_not_applicable(real, tmp_path):  # noqa: F811
    rc, res, _ = run_verdict(tmp_path, cluster(real, 2))
    assert rc == 0 and {res["hosts"][h]["slurm"]["status"] for h in ("node0", "node1")} == {"n/a"}


def test_a_working_cluster_passes(slurm_lab, tmp_path):
    rc, res, _ = run_verdict(tmp_path, slurm_lab)
    assert rc == 0, res["failures"]
    assert res["hosts"]["node0"]["slurm"]["detail"] == "munged, slurmd and slurmctld up; node0 idle"
    assert res["hosts"]["node1"]["slurm"]["detail"] == "munged, slurmd up; node1 idle"


@pytest.mark.parametrize("change,detail,fix", [
    (lambda p: p.update(missing=["munge", "unmunge", "sinfo", "sbatch"]),
     "munge, unmunge, sinfo, sbatch not installed on node1", SETUP),
    (lambda p: p["daemons"].update(munged=False), "munged is not running on node1", SETUP),
    (lambda p: p["munge"].update(ok=False, error="unmunge: Error: Invalid credential"),
     "munge -n | unmunge: unmunge: Error: Invalid credential on node1", SETUP),
    (lambda p: p["daemons"].update(slurmd=False), "slurmd not running on node1", SETUP),
    (lambda p: p["owner"].update(uid=1001, user="me"),
     "the run user differs between node0 and node1: lab is uid 1000 gid 1000 on node0, me is uid 1001 gid "
     "1000 on node1. Slurm runs a job on every node under the submitter's numbers, so on node1 the lab's "
     "jobs would run as whoever has uid 1000 there (and jobs from node1 as uid 1001 on node0)",
     "(as root on node1: usermod -u 1000 me)"),
    (lambda p: p["sinfo"].update(ok=False, state=None, error="sinfo: error: Protocol authentication error"),
     "slurmctld on node0 refuses node1's munge credential (sinfo: error: Protocol authentication error): "
     "the munge keys differ", SETUP),
    (lambda p: p["sinfo"].update(ok=False, state=None, error="Unable to contact slurm controller"),
     "sinfo on node1: Unable to contact slurm controller", "check slurmctld on node0"),
    (lambda p: p["sinfo"].update(state="down*"), "Slurm lists node1 as down*: no job starts there",
     "sudo scontrol update nodename=node1 state=resume"),
    (lambda p: p["sinfo"].update(state="drain"), "Slurm lists node1 as drain: no job starts there",
     "sudo scontrol update nodename=node1 state=resume"),
])
def test_each_fault_names_the_node_and_the_fix(slurm_lab, tmp_path, change, detail, fix):
    change(slurm_lab["node1/slurm.json"])
    rc, res, _ = run_verdict(tmp_path, slurm_lab)
    assert rc == 1 and failing(res) == {("node1", "slurm")}
    cell = res["hosts"]["node1"]["slurm"]
    assert cell["detail"] == detail and fix in cell["fix"]


def test_the_controller_without_slurmctld_fails(slurm_lab, tmp_path):
    slurm_lab["node0/slurm.json"]["daemons"]["slurmctld"] = False
    rc, res, _ = run_verdict(tmp_path, slurm_lab)
    assert rc == 1 and failing(res) == {("node0", "slurm")}
    assert res["hosts"]["node0"]["slurm"]["detail"] == "slurmctld not running on node0"


def test_no_probe_is_not_run_not_ok(slurm_lab, tmp_path):
    del slurm_lab["node1/slurm.json"]
    rc, res, _ = run_verdict(tmp_path, slurm_lab)
    assert rc == 1 and not res["failures"] and res["not_run"] == ["node1:slurm"]


def test_the_probe_on_a_machine_without_slurm_names_what_is_missing(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    facts = slurm_node.probe()
    assert facts["missing"] == list(slurm_node.COMMANDS) and "sinfo" not in facts
    assert set(facts["daemons"]) == {"munged", "slurmd", "slurmctld"}
