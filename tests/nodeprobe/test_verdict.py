"""The verdict on probe results of simulated clusters: each fault names its host, check and fix.

The fingerprint is a real one of this machine (on real shards); the network probes are written as a
10.77.0.0/24 cluster would report them (the shapes are those of the real probes, see
test_gloo_smoke.py::test_local_two_rank_preflight_passes_end_to_end).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from ddplab import code_tree
from ddplab.preflight import verdict as V
from ddplab.preflight.judge import CHECKS
from nodeprobe import hashing
from tests.helpers.probes import REPO, probe

PORT = 29500


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    base = tmp_path_factory.mktemp("verdict")
    shards = base / "shards"
    subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(shards), "--docs", "256",
                    "--rows-per-group", "16", "--groups-per-shard", "4"], check=True, cwd=REPO, timeout=120,
                   capture_output=True)
    fp = probe("fingerprint", "--data", str(shards), "--threads", "1", "--code", str(REPO / "nodeprobe"),
               "--root", str(base / "lab"))
    return {"fp": fp, "manifest": json.loads((shards / "manifest.json").read_text())}


def addr(i: int) -> str:
    return f"10.77.0.{10 + i}"


def conn(src: str, dst_addr: str, port: int, result: str = "connected") -> dict:
    ok = result == "connected"
    r = {"probe": "connect", "from": src, "host": dst_addr, "port": port, "timeout_s": 3.0, "ok": ok,
         "result": result, "address": dst_addr, "elapsed_s": 0.001 if ok else 3.0}
    if ok:
        r.update(banner=f"nodeprobe node {port}", nodeprobe_listener=True)
    else:
        r.update(errno={"timeout": "ETIMEDOUT", "refused": "ECONNREFUSED"}.get(result, "EHOSTUNREACH"))
    return r


def cluster(real, n: int = 2) -> dict:
    """{relative path: JSON} of a healthy n-host cluster."""
    names = [f"node{i}" for i in range(n)]
    files = {"inventory.json": {"master_port": PORT, "torch_version": "2.13.0", "threads": 1, "hosts": {
        h: {"rank": i, "addr": addr(i), "master": i == 0, "ifname": "eth0"} for i, h in enumerate(names)}},
        "manifest.json": real["manifest"]}
    for i, h in enumerate(names):
        fp = copy.deepcopy(real["fp"])
        fp["host"] = h
        fp["cpu"]["physical_cores"], fp["cpu"]["logical"] = 2, 2
        files[f"{h}/fingerprint.json"] = fp
        files[f"{h}/resolve.json"] = {
            "probe": "resolve", "hostname": h, "resolves": True, "addresses": [{"family": "ipv4",
                                                                                 "address": addr(i)}],
            "first": {"family": "ipv4", "address": addr(i)}, "any_loopback": False, "first_ipv6": False,
            "first_is_local": True}
        files[f"{h}/iface.json"] = {
            "probe": "iface", "ok": True, "master": addr(0), "family": "ipv4", "dev": "eth0", "src": addr(i),
            "dev_loopback": False, "same_subnet": True, "is_master": i == 0,
            "route": {"dev": "lo" if i == 0 else "eth0", "src": addr(i), "gateway": None},
            "interfaces": [{"name": "lo", "loopback": True, "families": ["ipv4", "ipv6"]},
                           {"name": "eth0", "loopback": False, "families": ["ipv4"]}]}
        files[f"{h}/lab_processes.json"] = {"probe": "lab-processes", "processes": [], "ranks": []}
        files[f"{h}/firewall.json"] = {"probe": "firewall", "ufw": True, "ufw_enabled": True,
                                       "ufw_input_policy": "DROP", "firewalld": False,
                                       "firewalld_running": None}
        files[f"{h}/gloo_smoke.json"] = {
            "probe": "gloo-smoke", "ok": True, "rank": i, "world": n, "phase": "done",
            "checks": {c: {"ok": True} for c in ("all_reduce_sum", "all_reduce_avg", "broadcast",
                                                 "all_gather")},
            "bandwidth": {"bytes": 16 << 20, "median_s": 0.02, "busbw_gbit_s": 6.7}}
        if i:
            files[f"{h}/tcp_master.json"] = conn(h, addr(0), PORT)
        files[f"{h}/tcp_peers.json"] = {"probe": "connect", "targets": {
            p: conn(h, addr(j), 40000 + j) for j, p in enumerate(names) if p != h}}
    files["node0/port_holder.json"] = {"probe": "port-holder", "port": PORT, "free": True, "holders": []}
    return files


def run_verdict(tmp_path, files: dict, *extra: str) -> tuple[int, dict, str]:
    inp = tmp_path / "in"
    for rel, data in files.items():
        (inp / rel).parent.mkdir(parents=True, exist_ok=True)
        (inp / rel).write_text(json.dumps(data))
    out = tmp_path / "runs" / "preflight" / "latest.json"
    rc = V.main(["--in", str(inp), "--out", str(out), *extra])
    return rc, json.loads(out.read_text()), ""


def failing(result: dict) -> set[tuple[str, str]]:
    return {(f["host"], f["check"]) for f in result["failures"]}


def fix_of(result: dict, host: str, check: str) -> str:
    return result["hosts"][host][check]["fix"]


@pytest.mark.parametrize("n", [2, 3])
def test_healthy_cluster_passes(real, tmp_path, capsys, n):
    rc, res, _ = run_verdict(tmp_path, cluster(real, n), "--code", str(REPO / "nodeprobe"))
    assert rc == 0 and res["ok"] and not res["failures"], res["failures"]
    assert set(res["hosts"]) == {f"node{i}" for i in range(n)} and res["checks"] == list(CHECKS)
    assert res["hosts"]["node1"]["master_port"]["status"] == "n/a"
    assert res["bandwidth"]["busbw_gbit_s"] == 6.7
    out = capsys.readouterr().out
    assert "preflight: ok" in out and "tcp_peers" in out


def _timeout_edges(files, src, dst, kinds=("tcp_master", "tcp_peers"), result="timeout"):
    i = int(dst[-1])
    if "tcp_master" in kinds and dst == "node0":
        files[f"{src}/tcp_master.json"] = conn(src, addr(0), PORT, result)
    if "tcp_peers" in kinds:
        files[f"{src}/tcp_peers.json"]["targets"][dst] = conn(src, addr(i), 40000 + i, result)


def test_master_inbound_blocked_except_ssh(real, tmp_path):
    f = cluster(real)
    _timeout_edges(f, "node1", "node0")
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node0", "tcp_master"), ("node0", "tcp_peers")}
    assert fix_of(res, "node0", "tcp_master") == "sudo ufw allow from 10.77.0.11  # on node0"
    assert "node1 -> node0 10.77.0.10:29500 timed out" in res["hosts"]["node0"]["tcp_master"]["detail"]


def test_worker_inbound_blocked_names_the_worker(real, tmp_path):
    f = cluster(real)
    _timeout_edges(f, "node0", "node1")
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "tcp_peers")}
    assert fix_of(res, "node1", "tcp_peers") == "sudo ufw allow from 10.77.0.10  # on node1"


def test_only_master_port_open_on_master(real, tmp_path):
    f = cluster(real)
    _timeout_edges(f, "node1", "node0", kinds=("tcp_peers",))
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node0", "tcp_peers")}
    detail = res["hosts"]["node0"]["tcp_peers"]["detail"]
    assert "master port 29500 is reachable, so only some ports are open" in detail


def test_refused_and_outbound_blocked_in_a_three_host_cluster(real, tmp_path):
    f = cluster(real, 3)
    for dst in ("node0", "node1"):  # node2 reaches nobody, while node1 reaches everyone: node2's outbound
        _timeout_edges(f, "node2", dst)
    f["node0/tcp_peers.json"]["targets"]["node1"] = conn("node0", addr(1), 40001, "refused")
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node2", "tcp_master"), ("node2", "tcp_peers"), ("node1", "tcp_peers")}
    assert "outbound" in fix_of(res, "node2", "tcp_peers")
    assert "refused" in res["hosts"]["node1"]["tcp_peers"]["detail"]


def _resolve_to(f, host, resolved):
    addrs = [{"family": fam, "address": a} for fam, a in resolved]
    f[f"{host}/resolve.json"].update(addresses=addrs, first=addrs[0], first_ipv6=addrs[0]["family"] == "ipv6",
                                     any_loopback=addrs[0]["address"].startswith("127."))


def test_ipv6_first_hostname_fails(real, tmp_path):
    f = cluster(real)
    _resolve_to(f, "node1", [("ipv6", "fd00:77::11"), ("ipv4", "10.77.0.11")])
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "hostname")}
    assert "ss_family 10 vs 2" in res["hosts"]["node1"]["hostname"]["detail"]
    assert fix_of(res, "node1", "hostname").startswith("fix /etc/hosts on node1 so node1 maps to 10.77.0.11")


def test_stock_127_0_1_1_line_passes_with_an_info_line_when_gloo_is_pinned(real, tmp_path, capsys):
    # Debian/Ubuntu's stock `127.0.1.1 <hostname>`: harmless once GLOO_SOCKET_IFNAME names the interface
    # (measured: a 2-host all_reduce was correct with it, and failed without the variable).
    f = cluster(real)
    _resolve_to(f, "node1", [("ipv4", "127.0.1.1"), ("ipv4", "10.77.0.11")])
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 0 and failing(res) == set()
    cell = res["hosts"]["node1"]["hostname"]
    assert cell["status"] == "ok" and cell["note"] == "info" and "GLOO_SOCKET_IFNAME=eth0" in cell["detail"]
    assert "INFO node1 hostname: node1 -> 127.0.1.1, 10.77.0.11; harmless" in capsys.readouterr().out


def test_127_0_1_1_fails_when_the_interface_is_not_right(real, tmp_path):
    f = cluster(real)
    _resolve_to(f, "node1", [("ipv4", "127.0.1.1")])
    f["node1/iface.json"].update(dev="wlan0", src="192.168.5.3", same_subnet=False)
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and ("node1", "hostname") in failing(res) and ("node1", "iface") in failing(res)
    assert "resolves to loopback" in res["hosts"]["node1"]["hostname"]["detail"]
    assert fix_of(res, "node1", "hostname").startswith("fix /etc/hosts on node1 so node1 maps to 10.77.0.11")


def test_python_minor_difference_is_said_and_a_torch_of_another_source_fails(real, tmp_path, capsys):
    f = cluster(real)
    py = f["node1/fingerprint.json"]["python"]
    major, minor = py["major_minor"].split(".")
    other = f"{major}.{int(minor) + 2}"  # Debian 12's 3.11 beside Debian 13's 3.13
    py.update(major_minor=other, version=f"{other}.0")
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 0 and res["hosts"]["node1"]["python"]["note"] == "info"
    assert "INFO node1 python: python " in capsys.readouterr().out
    # PyPI's CUDA build of the same release and commit (a Python with no +cpu wheel in reach): same gloo
    torch = f["node1/fingerprint.json"]["torch"]
    torch["version"] = torch["version"].split("+")[0] + "+cu130"
    rc, res, _ = run_verdict(tmp_path, f)
    cell = res["hosts"]["node1"]["torch"]
    assert rc == 0 and (cell["status"], cell["note"]) == ("ok", "info"), cell
    assert "+cu130 on node1 vs " in cell["detail"] and "the same source (commit " in cell["detail"]
    torch["git_version"] = "0" * 40  # another commit: another torch
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "torch")}
    assert "+cu130 on node1 vs " in res["hosts"]["node1"]["torch"]["detail"]


def test_process_on_master_port_is_named_with_the_kill(real, tmp_path):
    f = cluster(real)
    f["node0/port_holder.json"] = {"probe": "port-holder", "port": PORT, "free": False, "holders": [
        {"pid": 4242, "ppid": 1, "cmdline": "python3 -m http.server 29500", "family": "ipv4",
         "address": "0.0.0.0"}]}
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node0", "master_port")}
    assert fix_of(res, "node0", "master_port") == "kill 4242  # python3 -m http.server 29500 holds 29500"


@pytest.mark.parametrize("fault", ["changed", "extra", "missing"])
def test_shard_faults_name_the_file(real, tmp_path, fault):
    f = cluster(real)
    files = f["node1/fingerprint.json"]["data"]["files"]
    name = sorted(files)[1]
    if fault == "changed":
        files[name] = "0" * 64
    elif fault == "extra":
        name = "shard_99999.parquet"
        files[name] = "1" * 64
    else:
        del files[name]
    f["node1/fingerprint.json"]["data"]["digest"] = hashing.set_digest(files)
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "data")}
    assert f"{fault}: {name}" in res["hosts"]["node1"]["data"]["detail"]
    if fault == "extra":  # prepare prunes only the shards its record names: this one is someone's
        assert fix_of(res, "node1", "data") == (f"remove {name} from the data folder on node1 yourself "
                                                "(ddplab did not place it and keeps files it did not place)")
    else:
        assert fix_of(res, "node1", "data") == f"re-run playbooks/prepare.yml (dataset) to resync {name}"


def test_threads_dtype_torch_code_stale_faults_on_one_host(real, tmp_path):
    f = cluster(real)
    fp = f["node1/fingerprint.json"]
    fp["cpu"]["threads"] = 8
    fp["dtype"].update(asked="bf16", resolved="bf16", problem="bf16 asked on a CPU without bf16 units")
    fp["torch"]["version"] = "2.12.0+cpu"
    fp["code"]["nodeprobe"]["sha256"] = "f" * 64
    f["node1/lab_processes.json"]["processes"] = [
        {"pid": 777, "ppid": 1, "orphan": True, "role": "rank", "cmdline": "python -m torch.distributed.run"}]
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node1", c) for c in ("threads", "dtype", "torch", "code", "stale_processes")}
    assert fix_of(res, "node1", "threads") == "set ddplab_threads <= 2 (physical cores)"
    assert fix_of(res, "node1", "dtype") == "use --dtype fp32"
    assert fix_of(res, "node1", "torch").startswith("pip install torch==2.13.0")
    assert "prepare.yml to sync nodeprobe/ to node1" in fix_of(res, "node1", "code")
    assert fix_of(res, "node1", "stale_processes").startswith("ansible-playbook playbooks/prepare.yml")
    assert "kill 777 on node1" in fix_of(res, "node1", "stale_processes")
    assert "(orphan)" in res["hosts"]["node1"]["stale_processes"]["detail"]


def test_a_live_run_is_named_as_running_not_as_a_leftover(real, tmp_path):
    f = cluster(real)
    f["node1/lab_processes.json"]["processes"] = [
        {"pid": 700, "ppid": 650, "orphan": False, "role": "rank", "run": "run-a", "torchrun": True,
         "cmdline": "python -m torch.distributed.run --nnodes 2 -m trainer"},
        {"pid": 701, "ppid": 700, "orphan": False, "role": "rank", "run": "run-a", "torchrun": False,
         "cmdline": "python -m trainer --data d"}]
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "stale_processes")}
    assert res["hosts"]["node1"]["stale_processes"]["detail"] == \
        "run run-a is still running on node1 (torchrun pid 700)"
    assert fix_of(res, "node1", "stale_processes").startswith(
        "ansible-playbook playbooks/stop.yml -e ddplab_run_id=run-a")


def test_a_torchrun_started_by_hand_is_named_and_not_offered_to_prepare(real, tmp_path):
    f = cluster(real)
    f["node1/lab_processes.json"]["processes"] = [
        {"pid": 800, "ppid": 1, "orphan": True, "role": "rank", "run": "", "torchrun": True,
         "by_ddplab": False,
         "cmdline": "python /home/u/.venv/bin/torchrun --standalone /home/u/ddplab/code/train.py"}]
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "stale_processes")}
    assert "started by hand run in the lab folder on node1 (pid 800" in \
        res["hosts"]["node1"]["stale_processes"]["detail"]
    assert fix_of(res, "node1", "stale_processes") == "kill 800  # on node1, once that run is done"


def test_iface_faults(real, tmp_path):
    f = cluster(real, 3)
    f["node1/iface.json"].update(dev="wlan0", src="192.168.5.3", same_subnet=False)
    f["node2/iface.json"]["dev"] = "eth1"  # route says eth1, inventory pins eth0
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node1", "iface"), ("node2", "iface")}
    assert "not on the master's subnet" in res["hosts"]["node1"]["iface"]["detail"]
    assert fix_of(res, "node2", "iface") == "export GLOO_SOCKET_IFNAME=eth1"


def test_sshd_down_host_is_named_and_the_rest_is_skipped(real, tmp_path):
    f = {k: v for k, v in cluster(real).items() if not k.startswith("node1/")}
    f["node1/ssh.json"] = {"ok": False,
                           "error": "ssh: connect to host 10.77.0.11 port 22: Connection refused"}
    del f["node0/tcp_peers.json"]
    f["node0/gloo_smoke.json"] = {"probe": "gloo-smoke", "ok": False, "rank": 0, "world": 2, "phase": "init",
                                  "hung": True, "error": "watchdog: no progress in phase 'init' after 15 s",
                                  "checks": {}}
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "ssh"), ("node0", "gloo_smoke")}
    assert "Connection refused" in res["hosts"]["node1"]["ssh"]["detail"]
    assert res["hosts"]["node1"]["data"]["status"] == "skip"
    assert "hung" in res["hosts"]["node0"]["gloo_smoke"]["detail"]


def test_smoke_failure_points_at_the_network_failure(real, tmp_path):
    f = cluster(real)
    _timeout_edges(f, "node0", "node1")
    for i in range(2):
        f[f"node{i}/gloo_smoke.json"] = {"probe": "gloo-smoke", "ok": False, "rank": i, "world": 2,
                                         "phase": "init", "hung": True, "error": "watchdog", "checks": {}}
    rc, res, _ = run_verdict(tmp_path, f)
    assert failing(res) == {("node1", "tcp_peers"), ("node0", "gloo_smoke"), ("node1", "gloo_smoke")}
    assert fix_of(res, "node0", "gloo_smoke") == "fix the tcp_peers failures first, then re-run preflight"


def test_inventory_faults(real, tmp_path):
    f = cluster(real, 3)
    inv = f["inventory.json"]["hosts"]
    inv["node1"]["master"] = True
    inv["node2"].update(rank=1, addr="127.0.0.1")
    rc, res, _ = run_verdict(tmp_path, f)
    assert {("node0", "inventory"), ("node1", "inventory"), ("node2", "inventory")} <= failing(res)
    assert "2 masters" in res["hosts"]["node0"]["inventory"]["detail"]
    assert "rank 1 is used by node1, node2" in res["hosts"]["node2"]["inventory"]["detail"]
    assert "loopback" in res["hosts"]["node2"]["inventory"]["detail"]


def test_missing_probe_means_incomplete_not_ok(real, tmp_path, capsys):
    f = cluster(real)
    del f["node1/gloo_smoke.json"]
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and not res["failures"] and res["not_run"] == ["node1:gloo_smoke"]
    assert "INCOMPLETE" in capsys.readouterr().out


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    (tmp_path / "in").mkdir()
    out = tmp_path / "latest.json"
    r = subprocess.run([sys.executable, "-m", "ddplab", "preflight-verdict", "--in", str(tmp_path / "in"),
                        "--out", str(out)], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode == 2 and not out.exists()
    assert r.stderr.startswith("ddplab: error: ") and "inventory.json is missing" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_a_changed_copy_on_the_master_is_named_by_the_control_hosts_code_ref(real, tmp_path):
    """With the control host's hash given (--code-ref), the master's changed copy is the one named, not
    the nodes that still match what the control host would sync."""
    f = cluster(real)
    good = real["fp"]["code"]["nodeprobe"]["sha256"]
    f["node0/fingerprint.json"]["code"]["nodeprobe"]["sha256"] = "e" * 64
    rc, res, _ = run_verdict(tmp_path, f, f"--code-ref=nodeprobe={good}")
    assert rc == 1 and failing(res) == {("node0", "code")}
    assert "differs from the control host" in res["hosts"]["node0"]["code"]["detail"]
    assert "sync nodeprobe/ to node0" in fix_of(res, "node0", "code")


def test_a_bad_code_ref_is_one_line(tmp_path, capsys):
    (tmp_path / "in").mkdir()
    assert V.main(["--in", str(tmp_path / "in"), "--code-ref", "user=abc"]) == 2
    assert "--code-ref 'user=abc': use NAME=<64 hex digits>" in capsys.readouterr().err


def test_code_tree_hashes_what_it_would_sync_as_the_node_hashes_its_copy(tmp_path):
    """ddplab code-tree's per-folder hash == nodeprobe's tree_hash of the synced copy, and its total hash
    == the tree hash of the node's whole code folder (the one format of nodeprobe.hashing)."""
    import shutil

    src = tmp_path / "src"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "m.py").write_text("x = 1\n")
    (src / "pkg" / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\0junk")
    (src / "out.log").write_text("ignored\n")
    (src / ".gitignore").write_text("*.log\n")
    spec = json.dumps([{"src": str(src), "dest": "user", "mode": "gitignore"},
                       {"src": str(REPO / "nodeprobe"), "dest": "nodeprobe", "mode": "all"}])
    r = subprocess.run([sys.executable, "-m", "ddplab", "code-tree", spec], capture_output=True, text=True,
                       timeout=60, check=True, cwd=REPO)
    plan = json.loads(r.stdout)
    node = tmp_path / "node"
    for entry in plan["files"]:
        dest = node / entry["dest"]
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(entry["src"], dest)
    (node / ".ddplab-code-hash").write_text("a record of the sync, not code\n")
    user = [e["dest"] for e in plan["files"] if e["dest"].startswith("user/")]
    assert user == ["user/.gitignore", "user/pkg/m.py", "user/train.py"]
    trees = {t["dest"]: t for t in plan["trees"]}
    assert trees["user"]["hash"] == hashing.tree_hash(node / "user")["sha256"]
    assert trees["nodeprobe"]["hash"] == hashing.tree_hash(REPO / "nodeprobe")["sha256"]
    assert plan["hash"] == hashing.tree_hash(node)["sha256"]
    assert plan["lines"] == hashing.tree_lines(node)
    assert code_tree.plan([{"src": str(src), "dest": "user", "mode": "gitignore"}])["trees"][0]["hash"] \
        == trees["user"]["hash"]


def test_no_shards_asked_for_is_not_applicable_and_passes(real, tmp_path):
    """Your own code with ddplab_data_dir "": no manifest, no data in the fingerprints -> n/a, passes."""
    f = cluster(real)
    del f["manifest.json"]
    for h in ("node0", "node1"):
        f[f"{h}/fingerprint.json"].pop("data", None)
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 0 and res["ok"] is True and res["not_run"] == []
    assert {res["hosts"][h]["data"]["status"] for h in ("node0", "node1")} == {"n/a"}


def test_a_nearly_full_disk_is_one_fail_with_the_free_and_needed_bytes(real, tmp_path):
    f = cluster(real)
    disk = f["node1/fingerprint.json"]["disk"]
    assert disk["free_bytes"] > 0 and disk["checkpoint_bytes"] > 0  # the real probe of this machine
    need = disk["checkpoint_bytes"] * disk["checkpoints"]
    disk["free_bytes"] = need - 1
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node1", "disk")}
    detail = res["hosts"]["node1"]["disk"]["detail"]
    assert f"({need - 1} bytes)" in detail and "needs" in detail and f"({need} bytes: checkpoints" in detail
    assert "larger disk" in fix_of(res, "node1", "disk")
    disk["free_bytes"] = need
    rc, res, _ = run_verdict(tmp_path / "again", f)
    assert rc == 0, res["failures"]


def test_the_disk_check_counts_the_shards_a_node_lacks(real, tmp_path):
    """The verdict reads the control host's shard sizes beside its manifest (--data-dir)."""
    f = cluster(real)
    shards = tmp_path / "control"
    shards.mkdir()
    sizes = {}
    for i, name in enumerate(hashing.manifest_files(real["manifest"])):
        (shards / name).write_bytes(b"x" * (1000 + i))
        sizes[name] = 1000 + i
    (shards / "manifest.json").write_text(json.dumps(real["manifest"]))
    fp = f["node1/fingerprint.json"]
    del fp["data"]["files"][sorted(sizes)[0]]  # node1 lacks one shard
    disk = fp["disk"]
    need = disk["checkpoint_bytes"] * disk["checkpoints"] + sizes[sorted(sizes)[0]]
    disk["free_bytes"] = need - 1
    rc, res, _ = run_verdict(tmp_path, f, "--data-dir", str(shards))
    assert ("node1", "disk") in failing(res), res["failures"]
    assert f"shards {sizes[sorted(sizes)[0]] / (1 << 30):.2f} GiB" in res["hosts"]["node1"]["disk"]["detail"]
    assert f"({need} bytes:" in res["hosts"]["node1"]["disk"]["detail"]


def test_a_node_open_to_the_network_is_refused_with_both_fixes_unless_chosen(real, tmp_path, capsys):
    """Closed by default: ufw off on the master (stock Ubuntu), no firewall on a worker (stock Debian), or a
    ufw whose default lets everyone in: each such node FAILs the firewall row, naming the node and the two
    fixes; ddplab_open_to_lan: true turns each into a warning the run goes on with."""
    f = cluster(real)
    f["node0/firewall.json"].update(ufw_enabled=False)
    f["node1/firewall.json"].update(ufw=False, ufw_enabled=None, ufw_input_policy=None)
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 1 and failing(res) == {("node0", "firewall"), ("node1", "firewall")}, res["failures"]
    node0, node1 = res["hosts"]["node0"]["firewall"], res["hosts"]["node1"]["firewall"]
    assert node0["detail"].startswith("ufw is off on node0: the master port 29500 and gloo's ports would be "
                                      "open to every host of the network during a run"), node0
    assert node1["detail"].startswith("no firewall (ufw, firewalld) is installed on node1: gloo's ports"), \
        node1
    for cell in (node0, node1):
        assert "-e firewall_enable=true" in cell["fix"] and "ddplab_open_to_lan: true" in cell["fix"]
    assert "installs ufw and turns it on" in node1["fix"]
    out = capsys.readouterr().out
    assert "FAIL node0 firewall: ufw is off on node0" in out and "FAIL node1 firewall: no firewall" in out
    f["node0/firewall.json"].update(ufw_enabled=True, ufw_input_policy="ACCEPT")
    rc, res, _ = run_verdict(tmp_path / "accept", f)
    assert "lets every host in" in res["hosts"]["node0"]["firewall"]["detail"], res["hosts"]["node0"]
    f["inventory.json"]["open_to_lan"] = True
    rc, res, _ = run_verdict(tmp_path / "chosen", f)
    assert rc == 0 and not res["failures"], res["failures"]
    for h in ("node0", "node1"):
        assert res["hosts"][h]["firewall"]["note"] == "warning", res["hosts"][h]
        assert "as ddplab_open_to_lan: true allows" in res["hosts"][h]["firewall"]["detail"]


def test_a_node_whose_firewall_is_on_passes_the_firewall_row(real, tmp_path):
    f = cluster(real)
    f["node1/firewall.json"].update(ufw=False, firewalld=True, firewalld_running=True)
    rc, res, _ = run_verdict(tmp_path, f)
    assert rc == 0 and not res["failures"], res["failures"]
    assert res["hosts"]["node0"]["firewall"] == {
        "status": "ok", "detail": "ufw on: the master port 29500 and gloo's ports take the lab's nodes only",
        "fix": ""}
    f["node1/firewall.json"]["firewalld_running"] = False
    rc, res, _ = run_verdict(tmp_path / "stopped", f)
    assert "firewalld is stopped on node1" in res["hosts"]["node1"]["firewall"]["detail"]


def test_the_firewall_probe_reads_ufw_conf_without_root(tmp_path):
    from nodeprobe import net

    conf = tmp_path / "ufw.conf"
    assert net.firewall(str(conf))["ufw"] is False
    conf.write_text("# /etc/ufw/ufw.conf\n#\nENABLED=no\nLOGLEVEL=low\n")
    assert net.firewall(str(conf))["ufw_enabled"] is False
    conf.write_text("ENABLED=yes\n")
    assert net.firewall(str(conf))["ufw_enabled"] is True
    defaults = tmp_path / "ufw"
    defaults.write_text('IPV6=yes\nDEFAULT_INPUT_POLICY="DROP"\n')
    assert net.firewall(str(conf), str(defaults))["ufw_input_policy"] == "DROP"
    assert net.firewall(str(conf), str(tmp_path / "none"), firewalld=())["firewalld"] is False
