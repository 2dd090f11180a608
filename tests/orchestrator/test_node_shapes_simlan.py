"""Unequal node shapes from the inventory (issue 15): a host_vars `ddplab_nproc_per_node: 2` on node0 and the
default 1 on node1 make one world of 3 ranks across 2 simulated hosts, each node's threads derived from its
own CPUs and its own rank count."""

import json

import pytest

from tests.helpers.playbooks import make_shards, playbook, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return {"ddplab_data_dir": make_shards(tmp_path_factory.getbasetemp() / "shards"),
            "ddplab_runs_dir": tmp_path_factory.mktemp("shape-runs"), "ddplab_trainer_depth": 1,
            "ddplab_rdzv_timeout": 60, "ddplab_wait_poll": 10}


@pytest.fixture(scope="module")
def shaped(simlan_cluster):
    """The simulated inventory with node0 running 2 ranks (host_vars), removed afterwards."""
    cluster = simlan_cluster(2)
    host_vars = cluster.inventory_dir / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / "node0.yml").write_text("ddplab_nproc_per_node: 2\n")
    yield cluster
    (host_vars / "node0.yml").unlink()
    # ufw enabled with the lab's rules, lab folders written, the run's tmux session: the next module gets
    # fresh hosts (a later test of this worker that took this cluster found node0 let in to node1's ports)
    simlan_cluster.discard()


def test_two_ranks_on_one_node_and_one_on_the_other_train_as_one_world(shaped, lab):
    run_id = "shape-2-1"
    proc = playbook("launch.yml", inventory=shaped.inventory_dir, timeout=900,
                    extra={**lab, "ddplab_wait": True, "ddplab_run_id": run_id, "ddplab_trainer_steps": 3})
    assert proc.returncode == 0, tail(proc)
    run = lab["ddplab_runs_dir"] / run_id
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 3
    ranks = {host: sorted(p.name for p in (run / host).rglob("metrics.rank*.jsonl"))
             for host in ("node0", "node1")}
    assert ranks == {"node0": ["metrics.rank0.jsonl", "metrics.rank1.jsonl"],
                     "node1": ["metrics.rank2.jsonl"]}
    env = {host: dict(line.split("=", 1) for line in (run / host / "trainer.env").read_text().splitlines()
                      if "=" in line and not line.startswith("#")) for host in ("node0", "node1")}
    assert env["node0"]["NPROC_PER_NODE"] == "2" and env["node1"]["NPROC_PER_NODE"] == "1"
    assert env["node0"]["NNODES"] == env["node1"]["NNODES"] == "2"
    # torchrun ran every rank's Python through rank_python (its PYTHON_EXEC): a compile cache per local rank
    for host in ("node0", "node1"):
        assert env[host]["PYTHON_EXEC"].endswith(f"/runs/{run_id}/rank_python"), env[host]
        assert env[host]["DDPLAB_COMPILE_CACHE"].endswith("/compile-cache"), env[host]
    # the simulated hosts are one machine (one kernel boot id) and, not pinned, see the same CPUs: its 3 ranks
    # share them, where each host dividing the CPUs by its own ranks would oversubscribe the machine
    seen = {h: shaped.exec(h, ["sh", "-c", "nproc; taskset -cp $$ | cut -d: -f2; "
                                           "cat /proc/sys/kernel/random/boot_id"],
                           timeout=30, check=True).stdout.split() for h in ("node0", "node1")}
    assert seen["node0"] == seen["node1"], seen
    threads = max(1, int(seen["node0"][0]) // 3)
    assert int(env["node0"]["DDPLAB_THREADS"]) == int(env["node1"]["DDPLAB_THREADS"]) == threads
