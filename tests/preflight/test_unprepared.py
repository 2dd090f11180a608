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
NOT_PREPARED = {"rc": 3, "stdout": "", "stderr": (  # the node's line (ddplab/node_command.py)
    "ddplab: error: this node is not prepared: /root/ddplab/python names no Python; "
    "fix: run playbooks/prepare.yml")}


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
        "FAIL a python: a is not prepared: /root/ddplab/python names no Python",
        "FAIL b python: b is not prepared: /root/ddplab/python names no Python"]
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
         "detail": "b is not prepared: /root/ddplab/python names no Python",
         "fix": "run playbooks/prepare.yml (with -l b to prepare this node alone)"}]
    assert result["hosts"]["a"]["iface"]["status"] != SKIP
    assert "b:python" in gate(result)["failed"]


def test_the_cli_prints_one_line_per_unprepared_node(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--data-dir=",
                        "--out", str(tmp_path / "v.json")], input=json.dumps(bundle("a", "b")),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 1
    assert r.stdout.count("\nFAIL ") == 2 and "preflight: FAIL (2 failing checks)" in r.stdout


def test_a_fresh_node_whose_python_the_wheelhouse_lacks_is_named_with_the_fill(tmp_path):
    """A Debian 13 laptop (python 3.13) joins a lab whose wheelhouse was filled for 3.11: prepare would refuse
    it, so preflight says so with `make wheelhouse PYTHONS=...`; a node of a served Python keeps the plain
    "run prepare" fix. The node's words are those of roles/preflight/vars/main.yml (its python3 version)."""
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    (tmp_path / "manifest.json").write_text(json.dumps({
        "torch": "2.13.0", "files": [{"file": torch, "size": 1, "sha256": "0" * 64}],
        "torch_wheels": {"3.11 x86_64": [torch, "numpy-2.3.0-cp311-cp311-manylinux_2_28_x86_64.whl"]}}))
    doc = bundle("a", "b")
    doc["inventory"]["wheelhouse_dir"] = str(tmp_path)
    for host, python in (("a", "3.11"), ("b", "3.13")):
        gather = doc["results"]["gather"][host]
        gather["stderr"] = gather["stderr"].replace("; fix:", f" (its python3: {python} x86_64); fix:")
    result = verdict(doc)
    fails = {f["host"]: f for f in result["failures"]}
    assert fails["a"]["fix"] == "run playbooks/prepare.yml (with -l a to prepare this node alone)"
    assert fails["b"]["fix"] == 'make wheelhouse PYTHONS="3.13"  # then run playbooks/prepare.yml'
    assert fails["b"]["detail"] == (
        "b is not prepared: /root/ddplab/python names no Python (its python3: 3.13 x86_64); its python 3.13 "
        f"x86_64 has no torch 2.13.0 wheel in {tmp_path} (filled for: 3.11 x86_64)")
    assert 'fix: make wheelhouse PYTHONS="3.13"' in table(result)
    # no wheelhouse at all: prepare says what to do (make wheelhouse, or the index fallback)
    doc["inventory"]["wheelhouse_dir"] = str(tmp_path / "none")
    assert {f["fix"] for f in verdict(doc)["failures"]} == {
        f"run playbooks/prepare.yml (with -l {h} to prepare this node alone)" for h in "ab"}
