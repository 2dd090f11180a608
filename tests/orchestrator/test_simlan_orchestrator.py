"""The playbooks against 2 simulated hosts (real sshd, ufw, tmux, torchrun over the simlan bridge).

One cluster serves the whole module: the `first_launch` fixture prepares it and trains once (after a
launch refused by another program's listener on the master port, which the test then ends itself), and
every test asks for that fixture, so each test also runs alone (`pytest -k ufw`). The stop test
discards the cluster at its end.
"""

import json
import re
import shutil
import subprocess
import sys
import threading
import time

import pytest

from ddplab.lab_tag import retired_rule_comment
from nodeprobe import hashing
from simlan.network import GATEWAY  # the control host's address on the bridge
from tests.helpers.firewall import ephemeral_ports, lab_comment
from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail
from tests.helpers.trainer_runs import node_last_step

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

PORT = 29500
# firewall_enable: ufw starts inactive on these hosts; turned on, its rules are what the ufw test reads.
COMMON = {"ddplab_threads": 1, "ddplab_wait_poll": 10, "ddplab_rdzv_timeout": 30, "firewall_enable": "true"}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    shards = make_shards(tmp_path_factory.getbasetemp() / "shards")
    runs = tmp_path_factory.mktemp("simlan-runs")
    return {"ddplab_data_dir": shards, "ddplab_runs_dir": runs, **COMMON}


def lab_pids(cluster, host, run_id):
    """PIDs on `host` whose environment names this run (every rank process ddplab starts)."""
    code = ("import os,sys\n"
            "for p in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try: env = open(f'/proc/{p}/environ','rb').read()\n"
            "    except OSError: continue\n"
            f"    if b'DDPLAB_RUN_ID={run_id}\\0' in env: print(p)\n")
    out = cluster.exec(host, [sys.executable, "-c", code], timeout=30, check=True)
    return out.stdout.split()


@pytest.fixture(scope="module")
def first_launch(simlan_cluster, lab):
    """launch.yml (prepare, preflight, train 8 steps, wait) on fresh hosts, first with a listener of another
    program on the master port: (the launch made once the test ended the squatter itself, the squatter's
    pid, whether it survived the first launch and no rank started, that refused launch). The module's
    later tests start from here."""
    simlan2 = simlan_cluster(2, fresh=True)
    # Another program on the master port: the master would fail with EADDRINUSE, the worker hang.
    squatter = simlan2.exec("node0", ["bash", "-c", f"setsid {sys.executable} -c 'import socket,time; "
                                      f"s=socket.socket(); s.bind((\"0.0.0.0\",{PORT})); s.listen(); "
                                      f"time.sleep(3600)' >/dev/null 2>&1 </dev/null & echo $!"], timeout=30)
    squatter_pid = squatter.stdout.strip()
    deadline = time.monotonic() + 30  # a Python starting: 30-60 ms here, 0.8-1.1 s at 4 % of a CPU
    while f":{PORT}" not in simlan2.exec("node0", ["ss", "-Htln"], timeout=30).stdout:
        assert time.monotonic() < deadline, "the squatter did not listen"
        time.sleep(0.1)

    extra = {**lab, "ddplab_wait": "true", "ddplab_trainer_steps": 8, "ddplab_run_id": "sim-a"}
    refused = playbook("launch.yml", inventory=simlan2.inventory_dir, timeout=420, extra=extra)
    survived = simlan2.exec("node0", ["kill", "-0", squatter_pid], timeout=30).returncode == 0
    started = simlan2.exec("node0", ["tmux", "-S", "/root/ddplab/tmux.sock", "has-session", "-t", "=sim-a"],
                           timeout=30).returncode == 0
    # ddplab names it and leaves it alone: ending it is the user's call, made here
    simlan2.exec("node0", ["kill", squatter_pid], timeout=30)
    proc = playbook("launch.yml", inventory=simlan2.inventory_dir, timeout=420, extra=extra)
    return proc, squatter_pid, survived and not started, refused


def _prepared(first_launch) -> None:
    proc = first_launch[0]
    assert proc.returncode == 0, "the module's first launch.yml failed:\n" + tail(proc)


def test_launch_names_the_port_squatter_then_trains_across_hosts(simlan2, lab, first_launch):
    proc, squatter_pid, survived, refused = first_launch
    assert refused.returncode != 0, tail(refused)
    assert (f"ddplab: error: node0: master port {PORT} is held by PID {squatter_pid} of user root: "
            f"{sys.executable} -c import socket") in refused.stdout, tail(refused)
    assert "-e ddplab_master_port=N" in refused.stdout
    assert survived, "prepare signalled another program's process, or a rank started"
    assert proc.returncode == 0, tail(proc)

    run = lab["ddplab_runs_dir"] / "sim-a"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["byte_equivalent"] is True
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    assert sorted(summary["hosts"]) == ["node0", "node1"]
    for host, rank in (("node0", 0), ("node1", 1)):
        assert (run / host / "out" / f"metrics.rank{rank}.jsonl").read_text().count("\n") == 8
        assert f"rank {rank} exited with code 0" in (run / host / "launch.log").read_text()
        assert "iface eth0" in (run / host / "pane.txt").read_text()


def test_ufw_allows_exactly_the_peers(simlan2, lab, first_launch):
    _prepared(first_launch)
    addr = {h.name: h.addr for h in simlan2.hosts}
    for host, peer in (("node0", addr["node1"]), ("node1", addr["node0"])):
        status = simlan2.exec(host, ["ufw", "status"], timeout=30, check=True).stdout
        assert "Status: active" in status
        rules = [line.split() for line in status.splitlines()[4:] if line.strip()]
        allowed = sorted((r[0], r[2]) for r in rules if r[1] == "ALLOW")
        ports = ephemeral_ports(simlan2, host)
        # the peer only, and only to the master port and the ephemeral ports gloo listens on (the run in
        # first_launch trained across both hosts through these rules); no SSH rule existed, so ufw was
        # turned on with SSH allowed from the control host's address only
        assert allowed == sorted([(f"{PORT}/tcp", peer), (f"{ports}/tcp", peer), ("22/tcp", GATEWAY)]), status
        assert all(r[r.index("#") + 1] == lab_comment(addr["node0"]) for r in rules if "#" in r), status


def ufw_added(cluster, host: str) -> list[str]:
    out = cluster.exec(host, ["ufw", "show", "added"], timeout=30, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("ufw ")]


def test_a_second_lab_folder_with_the_same_master_keeps_its_own_rules(simlan2, lab, first_launch, tmp_path):
    """Two labs on the same hosts with the same master, in two lab folders (~/ddplab and ~/ddplab-b, whose
    master port is 29600). The rules are tagged per lab folder: lab b's prepare and cleanup touch only its
    own (its master port), and lab a's rules, the one both need included, stay. The old tag (the master's
    address alone) made them one lab: b's prepare deleted a's master-port rule as stale, its cleanup
    the rest."""
    _prepared(first_launch)
    addr = simlan2.host("node0").addr
    before = {h: ufw_added(simlan2, h) for h in ("node0", "node1")}
    other = {**lab, "ddplab_root": "/root/ddplab-b", "ddplab_master_port": 29600,
             "ddplab_runs_dir": tmp_path / "runs-b"}
    tag_a, tag_b = lab_comment(addr), lab_comment(addr, "/root/ddplab-b")
    try:
        added = playbook("prepare.yml", "--tags", "firewall", inventory=simlan2.inventory_dir, extra=other,
                         timeout=300)
        assert added.returncode == 0, tail(added)
        for host, peer in (("node0", simlan2.host("node1").addr), ("node1", addr)):
            rules = ufw_added(simlan2, host)
            assert rules == [*before[host],
                             f"ufw allow from {peer} to any port 29600 proto tcp comment '{tag_b}'"], rules
            assert all(tag_a in r for r in before[host]), before[host]
        cleaned = playbook("stop.yml", "--tags", "firewall_cleanup", inventory=simlan2.inventory_dir,
                           extra=other, timeout=300)
        assert cleaned.returncode == 0, tail(cleaned)
        assert {h: ufw_added(simlan2, h) for h in ("node0", "node1")} == before
        assert all("Status: active" in simlan2.exec(h, ["ufw", "status"], timeout=30).stdout
                   for h in ("node0", "node1"))
    finally:  # lab a's rules as they were, for the tests after
        for host, rules in before.items():
            for rule in rules:
                if rule not in ufw_added(simlan2, host):
                    simlan2.exec(host, ["sh", "-c", f"{rule} >/dev/null"], timeout=30)


def test_rules_of_a_moved_lab_folder_and_of_the_old_tag_form_go_another_labs_stay(simlan2, lab, first_launch):
    """Leftovers on node1: a rule of this lab's in the tag form before ddplab/lab_tag.py was its one home,
    and a rule of a lab folder that moved away (root's record names a folder without a lab now), each on a
    port no run uses; beside them another lab's rule, whose record names a lab folder that is there. The next
    prepare removes the two leftovers and the moved folder's record, and keeps the other lab's rule and record
    and this lab's rules (the old code kept every leftover: nothing recorded them as the lab's)."""
    _prepared(first_launch)
    addr = simlan2.host("node0").addr
    before = ufw_added(simlan2, "node1")
    moved, other = "ddplab-lab-0000dead", "ddplab-lab-0000beef"
    retired = retired_rule_comment(addr, "/root/ddplab")
    records = {moved: "/root/ddplab-moved", other: "/root/ddplab-other"}
    plant = ["mkdir -p /root/ddplab-other /var/lib/ddplab && touch /root/ddplab-other/.ddplab-lab"]
    for comment, port in ((retired, 29501), (moved, 29502), (other, 29503)):
        plant.append(f"ufw allow from {addr} to any port {port} proto tcp comment {comment} >/dev/null")
    for comment, root in records.items():
        spec = json.dumps({"comment": comment, "root": root, "host": "node1", "enabled_ufw": False})
        plant.append(f"echo '{spec}' > /var/lib/ddplab/firewall-{comment}-node1.json")
    try:
        simlan2.exec("node1", ["sh", "-c", " && ".join(plant)], timeout=60, check=True)
        proc = playbook("prepare.yml", "--tags", "firewall", inventory=simlan2.inventory_dir, extra=lab,
                        timeout=300)
        assert proc.returncode == 0, tail(proc)
        after = ufw_added(simlan2, "node1")
        kept = f"ufw allow from {addr} to any port 29503 proto tcp comment '{other}'"
        assert after == [*before, kept], after
        left = simlan2.exec("node1", ["ls", "/var/lib/ddplab"], timeout=30, check=True).stdout.split()
        assert f"firewall-{other}-node1.json" in left and f"firewall-{moved}-node1.json" not in left, left
    finally:
        simlan2.exec("node1", ["sh", "-c", f"ufw delete allow from {addr} to any port 29503 proto tcp; "
                               f"rm -rf /root/ddplab-other /var/lib/ddplab/firewall-{other}-node1.json"],
                     timeout=60)


def test_second_prepare_changes_nothing_and_check_diff_is_clean(simlan2, lab, first_launch):
    _prepared(first_launch)
    again = playbook("prepare.yml", inventory=simlan2.inventory_dir, extra=lab, timeout=300)
    assert again.returncode == 0, tail(again)
    assert {h: r["changed"] for h, r in recap(again).items()} == {"node0": 0, "node1": 0}, tail(again)
    check = playbook("prepare.yml", "--check", "--diff", inventory=simlan2.inventory_dir, extra=lab,
                     timeout=300)
    assert check.returncode == 0, tail(check)
    assert all(r["failed"] == 0 and r["changed"] == 0 for r in recap(check).values()), tail(check)


def test_shards_are_pruned_by_record_not_by_glob(simlan2, lab, first_launch, tmp_path):
    """Another shard set (the same shards under new names): the shards ddplab placed leave node1, a
    *.parquet someone else put in the data folder stays (the old prune removed every *.parquet not in the
    manifest)."""
    _prepared(first_launch)
    data = "/root/ddplab/data"
    simlan2.exec("node1", ["sh", "-c", f"echo not ddplab_s > {data}/mine.parquet"], timeout=30, check=True)
    manifest = json.loads((lab["ddplab_data_dir"] / "manifest.json").read_text())
    renamed = [{**e, "file": "renamed_" + e["file"]} for e in manifest["files"]]
    other = tmp_path / "shards"
    other.mkdir()
    for old, new in zip(manifest["files"], renamed, strict=True):
        shutil.copy2(lab["ddplab_data_dir"] / old["file"], other / new["file"])
    (other / "manifest.json").write_text(json.dumps(
        {**manifest, "files": renamed, "digest": hashing.manifest_digest(renamed)}))
    try:
        proc = playbook("prepare.yml", "--tags", "data", inventory=simlan2.inventory_dir,
                        extra={**lab, "ddplab_data_dir": other}, timeout=300)
        assert proc.returncode == 0, tail(proc)
        listed = simlan2.exec("node1", ["ls", data], timeout=30, check=True).stdout.split()
        assert sorted(f for f in listed if f.endswith(".parquet")) == sorted(
            ["mine.parquet", *(e["file"] for e in renamed)]), listed
    finally:
        simlan2.exec("node1", ["rm", "-f", f"{data}/mine.parquet"], timeout=30)
        back = playbook("prepare.yml", "--tags", "data", inventory=simlan2.inventory_dir, extra=lab,
                        timeout=300)
        assert back.returncode == 0, tail(back)


# The cut must land while the ranks train: a fixed 8 s after start.yml came before the first step here (load
# 7) and could come after the last one on a quiet machine (60 steps took 3.4-8.6 s in CI runs). The test
# waits for node1's first step, then cuts: CUT_STEPS of 55-145 ms leave 6-17 s of training for it.
CUT_STEPS = 120


def test_ssh_cut_mid_run_training_finishes_and_follow_reconnects(simlan2, lab, first_launch):
    _prepared(first_launch)
    start = playbook("start.yml", inventory=simlan2.inventory_dir, timeout=300,
                     extra={**lab, "ddplab_trainer_steps": CUT_STEPS, "ddplab_run_id": "sim-cut"})
    assert start.returncode == 0, tail(start)
    follow_out = {}

    def follow():
        argv = [sys.executable, "-m", "ddplab", "follow", "-i", str(simlan2.inventory_dir),
                "--run-id", "sim-cut", "--interval", "1", "--max-seconds", "240"]
        follow_out["proc"] = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=300)

    t = threading.Thread(target=follow)
    t.start()
    deadline = time.monotonic() + 300
    while node_last_step(simlan2, "node1", "sim-cut", 1) < 1:
        assert time.monotonic() < deadline, "node1's rank did not train"
        time.sleep(0.2)
    for host in ("node0", "node1"):
        simlan2.sshd(host, "restart", cut=True)
    at_cut = node_last_step(simlan2, "node1", "sim-cut", 1)
    print(f"\n[simlan] both sshds restarted, their sessions cut, at node1's step {at_cut} of {CUT_STEPS}")
    assert at_cut < CUT_STEPS, f"the run ended before the SSH cut (step {at_cut}): make it longer"
    # wait.yml (new SSH connections) follows the run to its end, collects the logs, checks exit codes.
    wait = playbook("wait.yml", inventory=simlan2.inventory_dir, timeout=400, extra=lab)
    t.join(timeout=320)
    assert wait.returncode == 0, tail(wait)
    summary = json.loads((lab["ddplab_runs_dir"] / "sim-cut" / "summary.json").read_text())
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    assert summary["steps"] == CUT_STEPS and summary["byte_equivalent"] is True
    # follow (ssh) saw both panes to the end across the SSH cut.
    out = follow_out["proc"]
    assert out.returncode == 0, out.stderr
    assert "node0 | ddplab: done" in out.stdout
    assert "node1 | ddplab: rank 1 exited with code 0" in out.stdout


def test_follow_checks_host_keys_against_known_hosts(simlan2, lab, first_launch, tmp_path):
    """follow uses the OpenSSH client with the inventory's ssh args: a known_hosts with the node's real key
    connects, one with another key for its address is refused (even beside StrictHostKeyChecking=no, which
    accept-new precedes, as in ansible.cfg)."""
    _prepared(first_launch)
    addr = {h.name: h.addr for h in simlan2.hosts}
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True,
                   timeout=30)
    scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", *addr.values()], capture_output=True,
                             text=True, timeout=30, check=True).stdout
    wrong = "".join(f"{a} {' '.join(other_key.with_suffix('.pub').read_text().split()[:2])}\n"
                    for a in addr.values())

    def follow_with(name: str, known_hosts: str) -> subprocess.CompletedProcess:
        inv = tmp_path / name
        shutil.copytree(simlan2.inventory_dir, inv)
        (inv / "known_hosts").write_text(known_hosts)
        (inv / "group_vars" / "all" / "zz_known_hosts.yml").write_text(
            f"ansible_ssh_common_args: -o UserKnownHostsFile={inv / 'known_hosts'} "
            "-o StrictHostKeyChecking=no -o LogLevel=ERROR\n")
        return subprocess.run([sys.executable, "-m", "ddplab", "follow", "-i", str(inv), "--run-id", "sim-a",
                               "--once"], cwd=REPO, text=True, capture_output=True, timeout=120)

    right = follow_with("right", scanned)
    assert right.returncode == 0, right.stderr
    assert "node0 | ddplab: run sim-a rank 0/2" in right.stdout and "node1 | " in right.stdout
    changed = follow_with("changed", wrong)
    assert changed.returncode != 0 and "Traceback" not in changed.stderr, changed.stderr
    assert f"ddplab: error: node0 (root@{addr['node0']}): its SSH host key is not the one in known_hosts" \
        in changed.stderr, changed.stderr
    assert "node0 |" not in changed.stdout


def test_stop_leaves_no_process_of_the_run(simlan2, lab, first_launch, simlan_cluster):
    try:
        _prepared(first_launch)
        start = playbook("start.yml", inventory=simlan2.inventory_dir, timeout=300,
                         extra={**lab, "ddplab_trainer_steps": 5000, "ddplab_run_id": "sim-stop"})
        assert start.returncode == 0, tail(start)
        deadline = time.monotonic() + 60
        while not all(len(lab_pids(simlan2, h, "sim-stop")) >= 2 for h in ("node0", "node1")):
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(1)
        stop = playbook("stop.yml", inventory=simlan2.inventory_dir, extra=lab, timeout=300)
        assert stop.returncode == 0, tail(stop)
        for host in ("node0", "node1"):
            assert lab_pids(simlan2, host, "sim-stop") == []
            ps = simlan2.exec(host, ["ps", "-eo", "args"], timeout=30, check=True).stdout
            assert "torch.distributed.run" not in ps and "-m trainer" not in ps, ps
            tmux = ["tmux", "-S", "/root/ddplab/tmux.sock", "has-session", "-t", "=sim-stop"]
            has = simlan2.exec(host, tmux, timeout=30)
            assert has.returncode != 0
        # status tells a run the user stopped from a failed one
        status = playbook("status.yml", inventory=simlan2.inventory_dir, timeout=300,
                          extra={**lab, "ddplab_run_id": "sim-stop"})
        assert status.returncode == 0, tail(status)
        assert len(re.findall(r"node\d\s+rank \d+\s+stopped \(stop\.yml\)", status.stdout)) == 2, tail(status)
        assert "failed first: " not in status.stdout  # (the task is named "... failed first")
    finally:
        simlan_cluster.discard()  # ufw enabled, lab folders written: the next module gets fresh hosts
