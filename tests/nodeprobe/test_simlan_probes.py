"""The network probes between two simulated hosts, with ufw on node1 dropping inbound traffic."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from ddplab.preflight import verdict as V
from tests.helpers.probes import REPO

pytestmark = [pytest.mark.simlan, pytest.mark.slow]


def _probe(cluster, host: str, *args: str) -> dict:
    r = cluster.exec(host, ["env", f"PYTHONPATH={REPO}", sys.executable, "-m", "nodeprobe", *args],
                     timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_one_way_firewall_is_named_on_the_blocking_host(simlan_cluster, tmp_path):
    if shutil.which("ufw", path="/usr/sbin:/usr/bin:/sbin:/bin") is None:
        pytest.skip("ufw (Debian package ufw) is not installed")
    # Fresh hosts: a cluster an earlier test of this worker prepared keeps ddplab's ufw rules (node0 allowed
    # to node1's ephemeral ports, where the probe listens), and enabling ufw would load them.
    c = simlan_cluster(2, fresh=True)
    a0, a1 = c.host("node0").addr, c.host("node1").addr  # 10.77.<lab>.10/.11
    try:
        r = _probe(c, "node1", "resolve")
        assert r["hostname"] == "node1" and r["first"]["address"] == a1 and not r["any_loopback"]
        i1 = _probe(c, "node1", "iface", "--master", a0)
        assert (i1["dev"], i1["src"], i1["same_subnet"]) == ("eth0", a1, True)
        assert i1["is_master"] is False
        i0 = _probe(c, "node0", "iface", "--master", a0)
        assert (i0["dev"], i0["is_master"], i0["same_subnet"]) == ("eth0", True, True)

        c.exec("node1", ["sh", "-c", "ufw default deny incoming && ufw allow 22/tcp && ufw --force enable"],
               timeout=60, check=True)
        ports = {h: _probe(c, h, "listen", "--seconds", "20", "--background")["port"]
                 for h in ("node0", "node1")}
        inp = tmp_path / "in"
        inv = {"master_port": 29500, "hosts": {"node0": {"rank": 0, "addr": a0, "master": True},
                                               "node1": {"rank": 1, "addr": a1}}}
        for src, dst, addr in (("node0", "node1", a1), ("node1", "node0", a0)):
            res = _probe(c, src, "connect", "--timeout", "2", "--target", f"{dst}={addr}:{ports[dst]}")
            (inp / src).mkdir(parents=True)
            (inp / src / "tcp_peers.json").write_text(json.dumps(res))
        (inp / "inventory.json").write_text(json.dumps(inv))
        out = tmp_path / "latest.json"
        assert V.main(["--in", str(inp), "--out", str(out)]) == 1
        v = json.loads(out.read_text())
        assert [(f["host"], f["check"]) for f in v["failures"]] == [("node1", "tcp_peers")]
        assert "timed out" in v["failures"][0]["detail"]
        assert v["failures"][0]["fix"] == f"sudo ufw allow from {a0}  # on node1"
        assert v["hosts"]["node0"]["tcp_peers"]["status"] == "ok"  # node1 -> node0 works

        # apply the fix the verdict printed, inside node1: the connection now passes
        c.exec("node1", ["ufw", "allow", "from", a0], timeout=60, check=True)
        res = _probe(c, "node0", "connect", "--timeout", "2",
                     "--target", f"node1={a1}:{ports['node1']}")
        assert res["targets"]["node1"]["ok"] and res["targets"]["node1"]["nodeprobe_listener"]
    finally:
        simlan_cluster.discard()
