"""ddplab_elastic on 3 simulated hosts: a worker host dies, comes back and rejoins, then the master's host
dies, and the two others finish the run; `launch.yml -e ddplab_wait=true` returns 0 and names the nodes.

One run covers all three, to keep the suite short:
- node1 (a worker) is killed;
- once the group of two trains, node1 is switched on again (`simlan revive-host`) and taken back with
  `start.yml --limit node1 -e ddplab_run_id=RUN`;
- once it trains in the group of three again, node0 is killed (the master, which held global rank 0
  and the first group's store).
A host is killed as simlan does it: cable pulled, every process SIGKILLed, so the survivors hear nothing
(no connection reset); they notice through the process-group timeout (20 s here) and the rendezvous
heartbeats, on the control host's store."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.helpers.playbooks import BIN, REPO, make_shards
from tests.helpers.trainer_runs import complete_lines

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

RUN = "elastic-sim"
# Enough steps for node1 to come back (revive, start.yml --limit, torch import, rendezvous) and for
# node0 to be killed while the run still trains. In a busy CI run (Nov 27, the junit XML's `groups`) the
# groups re-formed at steps 0/100/900/1000; alone at 0/100/700/900. Steps after the last group re-forms
# only burn CPU: 3,000 leaves three times the margin seen.
STEPS = 3000


def node_file(cluster, host: str, path: str) -> str:
    p = cluster.exec(host, ["cat", path], timeout=30)
    return p.stdout if p.returncode == 0 else ""


def membership(cluster, host: str) -> list[dict]:
    text = node_file(cluster, host, f"/root/ddplab/runs/{RUN}/out/membership.jsonl")
    return [json.loads(ln) for ln in complete_lines(text)]


def wait_until(what: str, check, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc.poll() is not None:
            out = proc.stdout.read()[-4000:]
            pytest.fail(f"launch.yml ended (rc {proc.returncode}) before {what}:\n{out}")
        time.sleep(1)
    pytest.fail(f"not within {timeout} s: {what}")


def test_the_run_survives_a_worker_and_then_the_master(simlan_cluster, tmp_path, record_property):
    cluster = simlan_cluster(3)
    extra = {"ddplab_data_dir": str(make_shards(tmp_path / "shards")),
             "ddplab_runs_dir": str(tmp_path / "runs"), "ddplab_run_id": RUN, "ddplab_wait": True,
             "ddplab_elastic": True, "ddplab_elastic_min_nodes": 1,
             "ddplab_threads": 1, "ddplab_trainer_steps": STEPS, "ddplab_trainer_depth": 1,
             "ddplab_pg_timeout": 20, "ddplab_wait_poll": 10,
             "ddplab_trainer_extra_args": ["--seq-len", "32", "--batch-size", "4", "--log-every", "50",
                                           "--ckpt-every", "100", "--ckpt-keep", "3", "--check-every", "100",
                                           "--straggler-every", "0"]}
    argv = [str(BIN / "ansible-playbook"), "-i", str(cluster.inventory_dir), "playbooks/launch.yml",
            "-e", json.dumps(extra)]
    env = {"ANSIBLE_NOCOLOR": "1", "PATH": f"{BIN}:/usr/sbin:/usr/bin:/sbin:/bin"}
    proc = subprocess.Popen(argv, cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, env=env)
    try:
        wait_until("node2 trains in a group of 3", lambda: any(
            len(g["nodes"]) == 3 for g in membership(cluster, "node2")), 600, proc)
        time.sleep(3)
        cluster.kill_host("node1")
        wait_until("the group re-forms as node0, node2", lambda: any(
            g["nodes"] == ["node0", "node2"] for g in membership(cluster, "node2")), 240, proc)
        cluster.revive_host("node1")
        join = [*argv[:3], "playbooks/start.yml", "-e", json.dumps({**extra, "ddplab_wait": False}),
                "--limit", "node1"]
        rejoin = subprocess.run(join, cwd=REPO, text=True, capture_output=True, stdin=subprocess.DEVNULL,
                                timeout=300, env=env)
        assert rejoin.returncode == 0, rejoin.stdout[-4000:] + rejoin.stderr[-2000:]
        wait_until("node1 trains in the group again", lambda: len(membership(cluster, "node2")) >= 3
                   and "node1" in membership(cluster, "node2")[-1]["nodes"], 240, proc)
        time.sleep(3)
        cluster.kill_host("node0")
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    history = membership(cluster, "node2")
    groups_seen = [(g["nodes"], g["resumed_step"]) for g in history]
    print(f"\n[elastic] groups (nodes, resumed_step): {groups_seen}")
    # in the junit XML of every CI run: how many of STEPS the rejoin took, the margin STEPS is chosen by
    record_property("groups", json.dumps(groups_seen))
    assert proc.returncode == 0, out[-6000:]
    groups = [g["nodes"] for g in history]
    assert groups == [["node0", "node1", "node2"], ["node0", "node2"], ["node0", "node1", "node2"],
                      ["node1", "node2"]], groups
    resumed = [g["resumed_step"] for g in history]
    assert all(s % 100 == 0 for s in resumed) and resumed == sorted(resumed)  # from checkpoints, forward
    for host in ("node1", "node2"):  # both finished every step; node1 got the newest checkpoint on rejoining
        summary = json.loads(node_file(cluster, host, f"/root/ddplab/runs/{RUN}/out/summary.json"))
        assert summary["steps"] == STEPS
    # the wait named the nodes that went away, and the outcome printed the membership history
    assert "node1 went away during run" in out and "node0 went away during run" in out
    assert "node0        rank 0  left the run" in out
    assert "node1        rank 1  went away, then rejoined" in out
    for change in ("node1 left; from step", "node1 joined; from step", "node0 left; from step"):
        assert change in out
