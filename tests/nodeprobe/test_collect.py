"""The preflight role's path without Ansible: `gather` (warm child), `gloo-smoke --warm`, and the verdict
reading a bundle of Ansible-shaped results on stdin (`--bundle -`, `--gate`)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.probes import REPO, probe


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_ansible(obj: dict, rc: int = 0) -> dict:
    """What a registered shell task looks like (the fields the verdict reads)."""
    return {"rc": rc, "stdout": json.dumps(obj), "stderr": "", "changed": False}


def _verdict(bundle: dict, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ddplab",
            "preflight-verdict",
            "--dump",
            str(tmp_path / "in"),
            "--code",
            str(REPO / "nodeprobe"),
            *args,
        ],
        input=json.dumps(bundle),
        text=True,
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("collect") / "shards"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.data",
            "prepare",
            "--out",
            str(out),
            "--docs",
            "128",
            "--rows-per-group",
            "16",
            "--groups-per-shard",
            "4",
        ],
        check=True,
        cwd=REPO,
        timeout=120,
        capture_output=True,
    )
    return out


@pytest.mark.slow  # two gloo ranks and a full gather; the other tests here are JSON in, JSON out
def test_gather_then_warm_smoke_then_bundle_verdict_passes(shards, tmp_path):
    port = _free_port()
    g = probe(
        "gather",
        "--master",
        "127.0.0.1",
        "--root",
        str(tmp_path / "lab"),
        "--shared",
        "--master-port",
        str(port),
        "--expect",
        "1",
        "--listen-seconds",
        "60",
        "--data",
        str(shards),
        "--threads",
        "1",
        "--code",
        str(REPO / "nodeprobe"),
        "--world",
        "1",
        "--trainer-args",
        json.dumps(["--depth", "1", "--dtype", "fp32"]),
        timeout=180,
    )
    res, warm = g["results"], g["warm"]
    assert res["port_holder"]["free"] and res["listen_master"]["ok"] and res["listen"]["ok"]
    assert res["fingerprint"]["torch"]["importable"] and res["fingerprint"]["dtype"]["resolved"] == "fp32"
    assert res["fingerprint"]["memory"]["sizes"]["depth"] == 1
    assert os.path.isdir(warm["dir"]) and warm["pid"]
    # the master-port listener quits after the one expected connection
    tcp = probe(
        "connect",
        "--target",
        f"@master=127.0.0.1:{port}",
        "--target",
        f"peer=127.0.0.1:{res['listen']['port']}",
    )
    assert all(t["ok"] and t["nodeprobe_listener"] for t in tcp["targets"].values())
    smoke = probe(
        "gloo-smoke",
        "--rank",
        "0",
        "--world",
        "1",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(port),
        "--timeout",
        "5",
        "--mb",
        "1",
        "--warm",
        warm["dir"],
        "--stop-listener",
        timeout=120,
    )
    assert smoke["ok"] and smoke["import_s"] < 1.0, smoke  # torch was already imported by the warm child
    assert not os.path.exists(warm["dir"])
    bundle = {
        "inventory": {
            "master_port": port,
            "torch_version": "2.13.0",
            "hosts": {"solo": {"rank": 0, "addr": "127.0.0.1", "master": True, "local": True, "threads": 1}},
        },
        "results": {
            "ssh": {"solo": {"ping": "pong"}},
            "gather": {"solo": _as_ansible(g)},
            "tcp": {"solo": {"skipped": True}},
            "gloo_smoke": {"solo": _as_ansible(smoke)},
        },
    }
    gate = _verdict(bundle, tmp_path, "--gate")
    assert gate.returncode == 0 and json.loads(gate.stdout)["smoke"] is True, gate.stderr
    out = tmp_path / "latest.json"
    v = _verdict(bundle, tmp_path, "--out", str(out), "--manifest", str(shards / "manifest.json"))
    assert v.returncode == 0, v.stdout + v.stderr
    verdict = json.loads(out.read_text())
    assert verdict["ok"] and verdict["hosts"]["solo"]["gloo_smoke"]["status"] == "ok"
    assert sorted(p.name for p in (tmp_path / "in" / "solo").iterdir()) == sorted(
        f"{n}.json"
        for n in ("ssh", "fingerprint", "resolve", "iface", "lab_processes", "firewall", "port_holder",
                  "gloo_smoke")
    )


def test_unreachable_and_unprepared_hosts_fail_fast_with_their_error(tmp_path):
    hosts = {"a": {"rank": 0, "addr": "10.77.9.10", "master": True}, "b": {"rank": 1, "addr": "10.77.9.11"}}
    refused = (
        "Failed to connect to the host via ssh: ssh: connect to host 10.77.9.11 port 22: Connection refused"
    )
    unprepared = {
        "rc": 3,
        "stdout": "",
        "stderr": "ddplab: error: this node is not prepared: /root/ddplab/python names no Python",
    }
    bundle = {
        "inventory": {"master_port": 29500, "hosts": hosts},
        "results": {
            "ssh": {"a": {"ping": "pong"}, "b": {"unreachable": True, "msg": refused}},
            "gather": {"a": unprepared, "b": {"skipped": True}},
        },
    }
    gate = _verdict(bundle, tmp_path, "--gate")
    assert gate.returncode == 0 and json.loads(gate.stdout)["smoke"] is False
    bundle["smoke_skipped"] = json.loads(gate.stdout)["reason"]
    out = tmp_path / "latest.json"
    t0 = time.monotonic()
    v = _verdict(bundle, tmp_path, "--out", str(out))
    assert v.returncode == 1 and time.monotonic() - t0 < 60
    verdict = json.loads(out.read_text())
    cells = verdict["hosts"]
    assert cells["b"]["ssh"]["status"] == "FAIL" and "Connection refused" in cells["b"]["ssh"]["detail"]
    # an unprepared node: one FAIL naming the fix, its other checks skipped (issue 13)
    assert cells["a"]["python"]["status"] == "FAIL" and "prepare.yml" in cells["a"]["python"]["fix"]
    assert cells["a"]["torch"]["status"] == "skip" and "a is not prepared" in cells["a"]["torch"]["detail"]
    assert (
        cells["a"]["gloo_smoke"]["status"] == "skip" and "failed first" in cells["a"]["gloo_smoke"]["detail"]
    )
    assert "FAIL b ssh:" in v.stdout


def test_bad_bundle_is_one_line_and_keeps_a_foreign_folder(tmp_path):
    foreign = tmp_path / "in"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    v = _verdict({"inventory": {"hosts": {"a": {}}}}, tmp_path)
    assert (
        v.returncode == 2 and v.stderr.startswith("ddplab: error: --dump") and "Traceback" not in v.stderr
    )
    assert (foreign / "keep.txt").read_text() == "mine"
    bad = subprocess.run(
        [sys.executable, "-m", "ddplab", "preflight-verdict", "--dump", str(tmp_path / "x")],
        input="{not json",
        text=True,
        capture_output=True,
        timeout=60,
        cwd=REPO,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "ddplab: error:" in bad.stderr
