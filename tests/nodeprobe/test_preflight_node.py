"""The preflight role's node steps (nodeprobe/preflight_node.py): the decisions from the spec, then the
steps run for real with the spec on stdin as the role sends it."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from nodeprobe import preflight_node as P
from tests.helpers.probes import REPO, probe


def spec(host="node1", **over) -> dict:
    """As roles/preflight/vars/main.yml builds it (Ansible may hand numbers and booleans over as text)."""
    base = {"host": host, "rank": "1" if host == "node1" else "0", "master": "node0",
            "master_addr": "10.77.0.10", "master_port": "29500", "world": "2", "up": ["node0", "node1"],
            "local": "False", "root": "/root/ddplab", "code_dir": "/root/ddplab/code",
            "code_trees": ["trainer", "nodeprobe"], "has_user_code": False, "user_code": "user",
            "has_data": True, "data_dir": "/root/ddplab/data", "threads": "0",
            "trainer_args": ["--depth", "2"], "listen_seconds": 60, "connect_timeout": 3, "smoke_timeout": 5,
            "smoke_mb": 4, "gloo_smoke": True}
    return {**base, **over}


def gather_out(listen_port=40001, warm="/tmp/ddplab-preflight-x", dev="eth0", listen_master=False) -> str:
    res = {"listen": {"ok": True, "port": listen_port}, "iface": {"dev": dev}}
    if listen_master:
        res["listen_master"] = {"ok": True}
    return "noise\n" + json.dumps({"probe": "gather", "warm": {"dir": warm, "pid": 7}, "results": res})


def test_gather_argv_master_reads_the_port_and_expects_every_answering_worker():
    m = P.gather_argv(spec("node0", up=["node0", "node1", "node2"]))
    assert m[m.index("--master-port") + 1] == "29500" and m[m.index("--expect") + 1] == "2"
    w = P.gather_argv(spec("node1"))
    assert "--master-port" not in w and "--shared" not in w and "--threads" not in w
    assert w[w.index("--data") + 1] == "/root/ddplab/data"
    assert [w[i + 1] for i, a in enumerate(w) if a == "--code"] == ["/root/ddplab/code/trainer",
                                                                   "/root/ddplab/code/nodeprobe"]
    assert json.loads(w[w.index("--trainer-args") + 1]) == ["--depth", "2"]


def test_gather_argv_optional_parts():
    a = P.gather_argv(spec(local="True", has_data="False", threads="2", has_user_code="True"))
    assert "--shared" in a and "--data" not in a and a[a.index("--threads") + 1] == "2"
    assert a[-1] == "/root/ddplab/code/user"
    from nodeprobe.__main__ import build_parser

    assert build_parser().parse_args(a).cmd == "gather"  # a command line nodeprobe accepts


def test_connect_targets_peers_with_a_listener_and_the_master_port_for_workers():
    peers = {"node0": gather_out(40000), "node1": gather_out(40001), "node2": "ddplab: error: broken"}
    addrs = {"node0": "10.77.0.10", "node1": "10.77.0.11", "node2": "10.77.0.12"}
    up = ["node0", "node1", "node2"]
    w = P.connect_targets(spec("node1", up=up, peers=peers, addrs=addrs))
    assert w == ["node0=10.77.0.10:40000", "@master=10.77.0.10:29500"]  # node2's listener never started
    m = P.connect_targets(spec("node0", up=up, peers=peers, addrs=addrs))
    assert m == ["node1=10.77.0.11:40001"]  # the master does not connect to its own port
    alone = P.connect_targets(spec("node1", up=["node1"], peers=peers, addrs=addrs))
    assert alone == []  # the master did not answer SSH: nothing listens on its port


def test_smoke_plan_runs_with_the_gathered_interface_and_warm_child():
    gate = {"smoke": True, "reason": ""}
    w = P.smoke_plan(spec("node1", gather=gather_out(dev="eth0"), gate=gate))["run"]
    assert w[:5] == ["gloo-smoke", "--rank", "1", "--world", "2"]
    assert w[w.index("--ifname") + 1] == "eth0" and w[w.index("--warm") + 1] == "/tmp/ddplab-preflight-x"
    assert "--stop-listener" not in w
    m = P.smoke_plan(spec("node0", gather=gather_out(dev=""), gate=gate))["run"]
    assert "--stop-listener" in m and "--ifname" not in m


@pytest.mark.parametrize(("over", "reason"), [
    ({"gloo_smoke": "False"}, "disabled (preflight_gloo_smoke: false)"),
    ({"gate": {"smoke": False, "reason": "node1:tcp_peers failed first"}}, "node1:tcp_peers failed first"),
    ({"gather": "ddplab: error: no Python"}, "the node's probes did not run"),
])
def test_smoke_plan_skips_and_cleans_up(over, reason):
    base = {"gather": gather_out(listen_master=True), "gate": {"smoke": True}}
    plan = P.smoke_plan(spec("node0", **{**base, **over}))
    assert plan["skip"] == reason
    if "gather" not in over:
        assert plan["stop_warm"] == "/tmp/ddplab-preflight-x" and plan["quit_master_listener"] is True
    worker = P.smoke_plan(spec("node1", **{**base, **over}))
    assert worker["quit_master_listener"] is False


def _step(verb: str, payload) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nodeprobe", verb], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_connect_step_reaches_a_real_listener():
    listener = probe("listen", "--port", "0", "--seconds", "10", "--bind", "127.0.0.1", "--background")
    port = listener["port"]
    s = spec("node1", up=["node0", "node1"], master_addr="127.0.0.1", master_port=str(port),
             addrs={"node0": "127.0.0.1"}, peers={"node0": gather_out(port)}, connect_timeout=2)
    r = _step("preflight-connect", s)
    assert r.returncode == 0, r.stderr
    targets = json.loads(r.stdout)["targets"]
    assert set(targets) == {"node0", "@master"} and all(t["ok"] for t in targets.values())


def test_smoke_step_skipped_stops_the_warm_child_and_says_why(tmp_path):
    warm = tmp_path / "warm"
    warm.mkdir()
    s = spec("node1", gather=gather_out(warm=str(warm)), gate={"smoke": False, "reason": "x failed first"})
    r = _step("preflight-smoke", s)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"probe": "gloo-smoke", "skipped": True, "reason": "x failed first"}
    assert (warm / "stop").exists()


def test_a_bad_spec_is_one_line():
    r = _step("preflight-gather", {"host": "node1"})
    assert r.returncode == 2 and "the spec on stdin has no" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "nodeprobe", "preflight-connect"], input="{not json",
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2 and "not JSON" in r.stderr and "Traceback" not in r.stderr


def outside_out(listen_port=40005, listen_master=None, held=None) -> str:
    res = {"listen": {"ok": True, "port": listen_port}}
    if listen_master:
        res["listen_master"] = {"ok": True, "port": listen_master}
    if held is not None:
        res["port_holder"] = {"free": not held}
    return json.dumps({"probe": "outside", "results": res, "connect": {"targets": {}}})


def test_limit_the_master_expects_the_left_out_workers_too():
    m = P.gather_argv(spec("node0", up=["node0", "node1"], left_out=["node2"]))
    assert m[m.index("--expect") + 1] == "2"


def test_limit_connect_targets_reach_the_left_out_nodes_and_a_left_out_masters_port():
    addrs = {"node0": "10.77.0.10", "node1": "10.77.0.11", "node2": "10.77.0.12"}
    # -l node1: node0 (the master) and node2 left out; node2's step printed nothing (no listener)
    s = spec("node1", up=["node1"], addrs=addrs, peers={"node1": gather_out(40001)},
             outside={"node0": outside_out(40005, held=False, listen_master=29500), "node2": ""})
    assert P.connect_targets(s) == ["node0=10.77.0.10:40005", "@master=10.77.0.10:29500"]
    # the master port is held (a live run's store): still a link to try; free but no listener: not
    held = {**s, "outside": {"node0": outside_out(40005, held=True)}}
    assert "@master=10.77.0.10:29500" in P.connect_targets(held)
    silent = {**s, "outside": {"node0": outside_out(40005, held=False)}}
    assert P.connect_targets(silent) == ["node0=10.77.0.10:40005"]
    # on the left-out node itself: the play's listeners, and the master port when the master is in the play
    w = P.connect_targets(spec("node1", up=["node0"], addrs=addrs, peers={"node0": gather_out(40000)}))
    assert w == ["node0=10.77.0.10:40000", "@master=10.77.0.10:29500"]


def test_outside_steps_listen_connect_and_stop_for_real():
    peer = probe("listen", "--port", "0", "--seconds", "10", "--bind", "127.0.0.1", "--background")
    s = spec("node1", up=["node0"], master_addr="127.0.0.1", master_port=str(peer["port"]),
             addrs={"node0": "127.0.0.1"}, peers={"node0": gather_out(peer["port"])}, connect_timeout=2,
             listen_seconds=20)
    r = _step("preflight-outside", s)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["probe"] == "outside" and set(out["connect"]["targets"]) == {"node0", "@master"}
    assert all(t["ok"] for t in out["connect"]["targets"].values())
    port = out["results"]["listen"]["port"]
    assert P.listener_port(r.stdout) == port
    stop = _step("preflight-outside-stop", {**s, "opened": r.stdout})
    assert json.loads(stop.stdout) == {"probe": "outside-stop", "stopped": {"listen": True}}
    from nodeprobe import net

    deadline = time.monotonic() + 5
    while net.connect("127.0.0.1", port, 0.5).get("ok") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert net.connect("127.0.0.1", port, 0.5)["result"] == "refused"  # the listener is gone
