"""A node that was never prepared gets one FAIL line naming the fix, not one per check (issue 13: 21
lines for two fresh nodes), and the gloo smoke test is not run toward it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

from ddplab.preflight import collect
from ddplab.preflight.judge import FAIL, SKIP, Judge
from ddplab.preflight.verdict import gate, judge, table

REPO = Path(__file__).resolve().parents[2]
NOT_PREPARED = {"rc": 3, "stdout": "", "stderr": "ddplab: error: /root/ddplab/python names no Python: the "
                                               "node is not prepared"}


def bundle(*unprepared: str) -> dict:
    ready = {"rc": 0, "changed": False, "stderr": "", "stdout": json.dumps({"probe": "gather", "results": {
        "iface": {"ok": True, "dev": "eth0"}, "port_holder": {"free": True}}})}
    hosts = {"a": {"rank": 0, "addr": "10.77.9.10", "master": True, "local": False, "threads": 0},
             "b": {"rank": 1, "addr": "10.77.9.11", "master": False, "local": False, "threads": 0}}
    return {"inventory": {"master_port": 29500, "torch_version": "2.13.0", "threads": 0, "hosts": hosts},
            "results": {"ssh": {h: {"ping": "pong"} for h in hosts},
                        "gather": {h: copy.deepcopy(NOT_PREPARED if h in unprepared else ready)
                                   for h in hosts},
                        "tcp": {h: {"skipped": True} for h in hosts},
                        "gloo_smoke": {h: {"skipped": True} for h in hosts}}}


def verdict(doc: dict) -> dict:
    return judge(Judge(collect.from_bundle(doc), None, {}))


def test_two_fresh_nodes_give_two_fail_lines():
    result = verdict(bundle("a", "b"))
    assert result["unprepared"] == ["a", "b"]
    assert [(f["host"], f["check"]) for f in result["failures"]] == [("a", "python"), ("b", "python")]
    lines = [ln for ln in table(result).splitlines() if ln.startswith("FAIL ")]
    assert lines == [
        "FAIL a python: a is not prepared (/root/ddplab/python names no Python: the node is not prepared)",
        "FAIL b python: b is not prepared (/root/ddplab/python names no Python: the node is not prepared)"]
    assert "run playbooks/prepare.yml (with -l b to prepare this node alone)" in table(result)
    # the other checks of an unprepared node are not run, and say why
    torch = result["hosts"]["b"]["torch"]
    assert torch["status"] == SKIP and torch["detail"] == "not checked: b is not prepared (see python)"
    assert gate(result)["smoke"] is False


def test_one_fresh_node_leaves_the_prepared_one_judged_as_before():
    result = verdict(bundle("b"))
    assert result["unprepared"] == ["b"]
    assert [f for f in result["failures"] if f["host"] == "b"] == [
        {"host": "b", "check": "python", "status": FAIL,
         "detail": "b is not prepared (/root/ddplab/python names no Python: the node is not prepared)",
         "fix": "run playbooks/prepare.yml (with -l b to prepare this node alone)"}]
    assert result["hosts"]["a"]["iface"]["status"] != SKIP
    assert "b:python" in gate(result)["failed"]


def test_the_cli_prints_one_line_per_unprepared_node(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--data-dir=",
                        "--out", str(tmp_path / "v.json")], input=json.dumps(bundle("a", "b")),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert r.stdout.count("\nFAIL ") == 2 and "preflight: FAIL (2 failing checks)" in r.stdout
