"""gloo-smoke with real process groups on 127.0.0.1, and the local end-to-end verdict."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time

import pytest

from tests.helpers.probes import REPO, popen_probe, probe

pytestmark = pytest.mark.slow


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _smoke(rank: int, world: int, port: int, timeout: float = 5, mb: float = 4):
    return popen_probe("gloo-smoke", "--rank", str(rank), "--world", str(world), "--master-addr", "127.0.0.1",
                       "--master-port", str(port), "--timeout", str(timeout), "--mb", str(mb), "--reps", "2")


def _result(p: subprocess.Popen, limit: float) -> tuple[dict, str]:
    out, err = p.communicate(timeout=limit)
    assert p.returncode == 0, err[-2000:]
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return json.loads(lines[0]), err


def test_two_ranks_pass_every_collective_and_measure_bandwidth():
    port = _free_port()
    procs = [_smoke(r, 2, port) for r in range(2)]
    try:
        results = [_result(p, 60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for r, res in enumerate(results):
        assert res["ok"] and res["phase"] == "done" and res["rank"] == r
        assert set(res["checks"]) == {"all_reduce_sum", "all_reduce_avg", "broadcast", "all_gather"}
        bw = res["bandwidth"]
        assert bw["bytes"] == 4 * (1 << 20) and len(bw["seconds"]) == 2
        assert bw["busbw_gbit_s"] == pytest.approx(bw["bytes"] * 8 / bw["median_s"] / 1e9, rel=0.01)
        # the CPU the transfer took: a share of a core, per rep (loopback: a memcpy-bound all-reduce)
        assert len(bw["cpu_s"]) == 2 and all(c > 0 for c in bw["cpu_s"])
        assert bw["cores_busy"] == pytest.approx(statistics.median(bw["cpu_s"]) / bw["median_s"], abs=0.002)
        # the machine's busy cores while both ranks ran the reps: at least a little, at most all of them
        mc = bw["machine_cores_busy"]
        assert mc is None or 0 <= mc <= os.cpu_count()


def test_stale_listener_on_master_port_fails_within_the_watchdog_bound():
    stale = socket.socket()
    stale.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    stale.bind(("127.0.0.1", 0))
    stale.listen(8)  # accepts into its backlog, never answers: what the field notes' stale process did
    port = stale.getsockname()[1]
    try:
        t0 = time.monotonic()
        worker, master = _smoke(1, 2, port, timeout=2), _smoke(0, 2, port, timeout=2)
        w, _ = _result(worker, 30)
        m, m_err = _result(master, 30)
        elapsed = time.monotonic() - t0
    finally:
        stale.close()
    assert m["ok"] is False and m["phase"] == "store" and "EADDRINUSE" in m["error"]
    assert "Traceback" not in m_err
    assert w["ok"] is False and w["phase"] == "store"
    assert w["elapsed_s"] <= w["import_s"] + w["watchdog_s"] + 1.0
    assert elapsed < 60  # watchdog bound + interpreter start (a busy 2-core box), never gloo's minutes


def test_local_two_rank_preflight_passes_end_to_end(tmp_path):
    """Every probe run for real on this machine as inventory/local would, then the verdict: all ok."""
    shards = tmp_path / "shards"
    subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(shards), "--docs", "128",
                    "--rows-per-group", "16", "--groups-per-shard", "4"], check=True, cwd=REPO, timeout=120,
                   capture_output=True)
    port = _free_port()
    hosts = {"rank0": {"rank": 0, "addr": "127.0.0.1", "master": True, "local": True, "threads": 1},
             "rank1": {"rank": 1, "addr": "127.0.0.1", "local": True, "threads": 1}}
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "inventory.json").write_text(json.dumps({"master_port": port, "torch_version": "2.13.0",
                                                    "hosts": hosts}))
    (inp / "manifest.json").write_text((shards / "manifest.json").read_text())
    smoke = [_smoke(r, 2, port) for r in range(2)]
    fp = probe("fingerprint", "--data", str(shards), "--threads", "1", "--code", str(REPO / "nodeprobe"))
    common = {"resolve": probe("resolve"), "iface": probe("iface", "--master", "127.0.0.1"),
              "lab_processes": probe("lab-processes", "--root", str(tmp_path / "lab"), "--shared"),
              "fingerprint": fp}  # --shared: other labs' trainers may run on this machine meanwhile
    results = [_result(p, 60)[0] for p in smoke]
    listener = probe("listen", "--port", "0", "--seconds", "10", "--bind", "127.0.0.1", "--background")
    for h in hosts:
        (inp / h).mkdir()
        for name, data in common.items():
            (inp / h / f"{name}.json").write_text(json.dumps(data))
        (inp / h / "gloo_smoke.json").write_text(json.dumps(results[hosts[h]["rank"]]))
    (inp / "rank0" / "port_holder.json").write_text(json.dumps(probe("port-holder", "--port", str(port))))
    (inp / "rank1" / "tcp_master.json").write_text(json.dumps(
        probe("connect", "--host", "127.0.0.1", "--port", str(listener["port"]))))
    for src, dst in (("rank0", "rank1"), ("rank1", "rank0")):
        (inp / src / "tcp_peers.json").write_text(json.dumps(
            probe("connect", "--target", f"{dst}=127.0.0.1:{listener['port']}")))
    out = tmp_path / "latest.json"
    v = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--in", str(inp), "--out",
                        str(out), "--code", str(REPO / "nodeprobe")],
                       capture_output=True, text=True, timeout=30, cwd=REPO)
    verdict = json.loads(out.read_text())
    assert v.returncode == 0, v.stdout + v.stderr
    assert verdict["ok"] and not verdict["failures"]
    assert {c["status"] for row in verdict["hosts"].values() for c in row.values()} == {"ok", "n/a"}
    assert verdict["bandwidth"]["busbw_gbit_s"] > 0 and "preflight: ok" in v.stdout
