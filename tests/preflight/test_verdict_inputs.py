"""Control side of preflight without hosts: the bundle judged in memory, the debug dump judged again,
the smoke skip shown on every node, and the control-side verbs the roles call (check-requirements)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddplab.preflight import collect

REPO = Path(__file__).resolve().parents[2]


def _ran(obj: dict, rc: int = 0) -> dict:
    return {"rc": rc, "stdout": "warning: noise\n" + json.dumps(obj), "stderr": "", "changed": False}


BUNDLE = {
    "inventory": {"master_port": 29500, "torch_version": "2.13.0", "threads": 0, "hosts": {
        "a": {"rank": 0, "addr": "10.77.9.10", "master": True, "local": False, "threads": 0},
        "b": {"rank": 1, "addr": "10.77.9.11", "master": False, "local": False, "threads": 0},
        "c": {"rank": 2, "addr": "10.77.9.12", "master": False, "local": False, "threads": 0}}},
    "results": {
        "ssh": {"a": {"ping": "pong"}, "b": {"ping": "pong"}, "c": {"unreachable": True, "msg": "No route"}},
        "gather": {"a": _ran({"probe": "gather", "results": {"iface": {"ok": True, "dev": "eth0"},
                                                             "port_holder": {"free": True}}}),
                   "b": {"rc": 3, "stdout": "",
                         "stderr": "ddplab: error: this node is not prepared: /r/python names no Python"},
                   "c": {"skipped": True}},
        "tcp": {"a": _ran({"probe": "connect", "targets": {"b": {"ok": False, "result": "refused"}}}),
                "b": {"skipped": True}, "c": {"skipped": True}},
        "gloo_smoke": {"a": _ran({"probe": "gloo-smoke", "skipped": True, "reason": "b:torch failed first"}),
                       "b": {"skipped": True}, "c": {"skipped": True}},
    },
}


def test_bundle_becomes_probes_per_host_and_the_skip_reaches_every_answering_node():
    inputs = collect.from_bundle(BUNDLE)
    a, b, c = (inputs.probes[h] for h in "abc")
    assert a["iface"]["dev"] == "eth0" and a["port_holder"]["free"] and a["ssh"] == {"ok": True}
    assert a["tcp_peers"]["targets"] == {"b": {"ok": False, "result": "refused"}} and "tcp_master" not in a
    # b printed no JSON: every probe of its gather is that error (b is no master: no port_holder)
    assert set(b) == {"ssh", "fingerprint", "resolve", "iface", "lab_processes", "firewall", "gloo_smoke"}
    assert "not prepared" in b["fingerprint"]["error"]
    assert b["gloo_smoke"] == {"probe": "gloo-smoke", "skipped": True, "reason": "b:torch failed first"}
    assert c == {"ssh": {"ok": False, "error": "No route"}}  # unreachable: nothing else, no smoke either


def test_debug_dump_is_judged_again_to_the_same_table(tmp_path):
    def verdict(*args, stdin=None):
        return subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", *args], input=stdin,
                              capture_output=True, text=True, timeout=60, cwd=REPO)

    first = verdict("--out", str(tmp_path / "one.json"), "--dump", str(tmp_path / "dump"), "--data-dir=",
                    stdin=json.dumps(BUNDLE))
    assert first.returncode == 1, first.stderr
    assert sorted(p.name for p in (tmp_path / "dump" / "a").iterdir()) == [
        "gloo_smoke.json", "iface.json", "port_holder.json", "ssh.json", "tcp_peers.json"]
    again = verdict("--in", str(tmp_path / "dump"), "--out", str(tmp_path / "two.json"))
    one, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("one", "two"))
    assert one["hosts"] == two["hosts"] and one["failures"] == two["failures"]
    assert first.stdout.splitlines()[:-1] == again.stdout.splitlines()[:-1]  # all but the "written:" line
    assert "FAIL c ssh:" in first.stdout and "     fix: " in first.stdout
    assert one["hosts"]["b"]["gloo_smoke"]["detail"] == "not run: b:torch failed first"


def test_no_dump_unless_asked(tmp_path):
    r = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--gate", "--dump="],
                       input=json.dumps(BUNDLE), capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PYTHONPATH": str(REPO)})
    assert r.returncode == 0 and json.loads(r.stdout)["smoke"] is False
    assert list(tmp_path.iterdir()) == []  # neither an input folder nor a verdict file


def test_check_requirements_names_the_file_and_line(tmp_path):
    req = tmp_path / "requirements.txt"
    (tmp_path / "more.txt").write_text("numpy\ntorch>=2.14  # too new\n")
    req.write_text("-r more.txt\ntorch==2.13.0\n")
    r = subprocess.run([sys.executable, "-m", "ddplab", "check-requirements", str(req), "2.13.0"],
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and r.stderr.count("ddplab: error:") == 1
    assert "more.txt line 2 asks for torch>=2.14" in r.stderr
    req.write_text("torch==2.13.0\nnumpy\n")
    ok = subprocess.run([sys.executable, "-m", "ddplab", "check-requirements", str(req), "2.13.0"],
                        capture_output=True, text=True, timeout=60, cwd=REPO)
    assert ok.returncode == 0 and ok.stderr == ""


def limited_bundle(*left_out):
    """BUNDLE under a --limit that leaves out these of a (master), b and c: known from the inventory."""
    bundle = json.loads(json.dumps(BUNDLE))
    every = {"a": ("10.77.9.10", 0), "b": ("10.77.9.11", 1), "c": ("10.77.9.12", 2)}
    inv = bundle["inventory"]
    inv.update(left_out=list(left_out), master_host="a", addrs={h: every[h][0] for h in left_out},
               ranks={h: every[h][1] for h in left_out})
    for h in left_out:
        inv["hosts"][h] = {}
    return bundle


def test_limit_rows_say_not_asked_and_the_gate_skips_the_smoke_test(tmp_path):
    """preflight.yml -l a: b and c are known from the inventory only; nothing about them FAILs or SKIPs."""
    bundle = limited_bundle("b", "c")
    bundle["results"] = {
        "ssh": {"a": {"ping": "pong"}},
        "gather": {"a": _ran({"probe": "gather", "results": {"iface": {"ok": True, "dev": "eth0"},
                                                             "port_holder": {"free": True}}})},
        "tcp": {"a": {"skipped": True}}}

    def verdict(*args):
        return subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--data-dir=", *args],
                              input=json.dumps(bundle), capture_output=True, text=True, timeout=60, cwd=REPO)

    gate = verdict("--gate")
    assert json.loads(gate.stdout.splitlines()[-1])["smoke"] is False
    assert "b, c left out by --limit" in gate.stdout
    out = verdict("--out", str(tmp_path / "v.json"))
    result = json.loads((tmp_path / "v.json").read_text())
    for h in "bc":
        assert {v["status"] for v in result["hosts"][h].values()} == {"n/a"}, result["hosts"][h]
        assert result["hosts"][h]["inventory"]["detail"] == "not asked (left out by --limit)"
    assert result["hosts"]["a"]["tcp_peers"]["status"] == "n/a"
    assert "not checked (left out by --limit)" in result["hosts"]["a"]["tcp_peers"]["detail"]
    assert all(f["host"] == "a" for f in result["failures"])
    assert "not asked (--limit): b, c" in out.stdout


def test_limit_links_with_the_left_out_nodes_are_real_rows(tmp_path):
    """preflight.yml -l b: a (the master) answered and blocks b's connects; c did not answer over SSH."""
    bundle = limited_bundle("a", "c")
    drop = {"ok": False, "result": "timeout", "timeout_s": 3.0, "address": "10.77.9.10"}
    bundle["results"] = {
        "ssh": {"b": {"ping": "pong"}},
        "gather": {"b": _ran({"probe": "gather", "results": {"iface": {"ok": True, "dev": "eth0"}}})},
        "tcp": {"b": _ran({"probe": "connect", "targets": {"a": {**drop, "port": 40000},
                                                           "@master": {**drop, "port": 29500}}})},
        "outside": {"a": _ran({"probe": "outside", "results": {"listen": {"ok": True, "port": 40000}},
                               "connect": {"targets": {"b": {"ok": True, "port": 40001}}}})},
        "outside_ssh": _ran({"probe": "connect", "targets": {
            "a": {"ok": True}, "c": {"ok": False, "host": "10.77.9.12", "port": 22, "result": "refused",
                                     "error": "Connection refused"}}})}
    out = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--data-dir=", "--out",
                          str(tmp_path / "v.json")], input=json.dumps(bundle), capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 1, out.stderr
    hosts = json.loads((tmp_path / "v.json").read_text())["hosts"]
    assert hosts["a"]["ssh"]["status"] == "ok" and hosts["a"]["tcp_peers"]["status"] == "FAIL"
    assert "b -> a 10.77.9.10:40000 timed out" in hosts["a"]["tcp_peers"]["detail"]
    assert hosts["a"]["tcp_master"]["fix"] == "sudo ufw allow from 10.77.9.11  # on a"
    assert hosts["a"]["torch"]["status"] == "n/a" and hosts["a"]["master_port"]["status"] == "n/a"
    assert hosts["c"]["ssh"]["status"] == "FAIL" and "c (left out by --limit) did not answer over SSH" in \
        hosts["c"]["ssh"]["detail"] and "10.77.9.12:22" in hosts["c"]["ssh"]["detail"]
    assert {v["status"] for c, v in hosts["c"].items() if c != "ssh"} == {"n/a"}
    assert "toward c: unknown (did not answer over SSH)" in hosts["b"]["tcp_peers"]["detail"]
    assert "FAIL a tcp_peers: b -> a" in out.stdout and "FAIL c ssh:" in out.stdout
