"""The preflight role's data across hosts (roles/preflight/filter_plugins/preflight_data.py); the role
itself runs on simulated hosts in tests/preflight/test_preflight_simlan.py and, under --limit, in
tests/orchestrator/test_limit_simlan.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "preflight_data", REPO / "roles/preflight/filter_plugins/preflight_data.py")
data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(data)

HOSTVARS = {
    "node0": {"preflight_gather": {"rc": 0, "stdout": "{}"}, "preflight_self": {"addr": "10.0.0.10"},
              "ddplab_node_rank": 0, "ansible_host": "10.0.0.10"},
    "node1": {"preflight_gather": {"rc": 0, "skipped": True}, "preflight_self": {"addr": "10.0.0.11"},
              "ansible_host": "", "ansible_port": 2222},
    "local0": {"ansible_connection": "local"},
}


def test_per_host_takes_a_field_or_its_default_and_leaves_out_hosts_without_one():
    assert data.per_host(["node0", "node1"], HOSTVARS, "preflight_gather.stdout", "") == {"node0": "{}",
                                                                                         "node1": ""}
    assert data.per_host(["node0", "node1"], HOSTVARS, "preflight_self.addr") == {"node0": "10.0.0.10",
                                                                                 "node1": "10.0.0.11"}
    ranks = data.per_host(["node0", "node1"], HOSTVARS, "ddplab_node_rank", None)
    assert ranks == {"node0": 0, "node1": None}
    assert data.per_host(["node0", "local0"], HOSTVARS, "preflight_gather") == {
        "node0": HOSTVARS["node0"]["preflight_gather"]}


def test_ssh_targets_name_the_ssh_address_and_port_of_nodes_reached_over_ssh():
    assert data.ssh_targets(["node0", "node1", "local0"], HOSTVARS) == ["node0=10.0.0.10:22",
                                                                        "node1=node1:2222"]


def test_silent_targets_are_the_connect_targets_that_did_not_answer():
    out = {"targets": {"node0": {"ok": True}, "node1": {"ok": False, "error": "timed out"}, "node2": {}}}
    assert data.silent_targets({"stdout_lines": ["progress", json.dumps(out)]}) == ["node1", "node2"]
    assert data.silent_targets({"skipped": True}) == [] == data.silent_targets({})


def test_by_item_keys_a_loops_results_by_their_item():
    results = [{"item": "node0", "stdout": "a"}, {"item": "node1", "unreachable": True}]
    assert data.by_item(results, "stdout") == {"node0": "a"}
    assert data.by_item(results) == {"node0": results[0], "node1": results[1]}
    assert data.by_item([]) == {}


def test_verdict_argv_names_every_code_tree_include_and_sync_dir():
    settings = {"data_dir": "/d", "code_subdir": "user", "code_dir": "/c", "dump_dir": "", "repo_dir": "/r",
                "code_trees": ["trainer", "nodeprobe"], "code_include": ["*.txt"],
                "sync_dirs": [{"src": "/s", "dest": "extra"}]}
    assert data.verdict_argv("/py", settings) == [
        "/py", "-m", "ddplab", "preflight-verdict", "--data-dir=/d", "--code-tree=user=/c", "--dump=",
        "--code=/r/trainer", "--code=/r/nodeprobe", "--code-include=*.txt",
        '--sync-dir={"src": "/s", "dest": "extra"}']
