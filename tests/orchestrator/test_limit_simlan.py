"""`--limit` on every playbook, on 2 simulated hosts (issue: work on part of the lab).

A module fixture launches one finished run; each test then works on part of the lab and can run alone.
"""

import json
import os
import shutil
import subprocess
import time

import pytest

from tests.helpers.firewall import ephemeral_ports, peer_rules
from tests.helpers.playbooks import empty_plays, make_shards, playbook, recap, tail, task_headers

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

COMMON = {"ddplab_threads": 1, "ddplab_wait_poll": 10, "ddplab_rdzv_timeout": 30}
RUN = "lim-a"
# A relaunch of a prepared, unchanged lab shows at most this many task headers (issue 48).
RELAUNCH_TASK_HEADERS = 25


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    shards = make_shards(tmp_path_factory.getbasetemp() / "shards")
    runs = tmp_path_factory.mktemp("limit-runs")
    return {"ddplab_data_dir": shards, "ddplab_runs_dir": runs, **COMMON}


@pytest.fixture(scope="module")
def finished(simlan_cluster, lab):
    """A 2-host cluster with run lim-a finished (both ranks exited 0); discarded after the module."""
    cluster = simlan_cluster(2)
    proc = playbook("launch.yml", inventory=cluster.inventory_dir, timeout=420,
                    extra={**lab, "ddplab_wait": "true", "ddplab_trainer_steps": 3, "ddplab_run_id": RUN})
    assert proc.returncode == 0, tail(proc)
    yield cluster
    simlan_cluster.discard()


def rows(proc):
    """{host: verdict} from status.yml's table lines."""
    out = {}
    for line in proc.stdout.splitlines():
        line = line.strip().strip('",')
        for host in ("node0", "node1"):
            if line.startswith(f"{host} ") and " rank " in line:
                out[host] = line.split(" rank ", 1)[1][3:].split(" step ")[0].strip()
    return out


@pytest.mark.parametrize("chosen,other", [("node0", "node1"), ("node1", "node0")])
def test_status_limit_lists_the_others_as_not_asked(finished, lab, chosen, other):
    proc = playbook("status.yml", "-l", chosen, inventory=finished.inventory_dir, extra=lab)
    assert proc.returncode == 0, tail(proc)
    got = rows(proc)
    assert got[chosen] == "finished", tail(proc)
    assert got[other] == "not asked (left out by --limit)", tail(proc)
    assert "not answering" not in got.values() and "no answer over SSH" not in proc.stdout
    assert f"failed first: unknown ({other} not asked" in proc.stdout


def test_collect_limit_keeps_what_was_collected_from_the_others(finished, lab):
    run = lab["ddplab_runs_dir"] / RUN
    shutil.rmtree(run, ignore_errors=True)
    one = playbook("collect_logs.yml", "-l", "node1", inventory=finished.inventory_dir, extra=lab)
    assert one.returncode == 0, tail(one)
    assert (run / "node1" / "launch.log").exists() and not (run / "node0").exists()
    assert "- logs collected from: node1 (not collected: node0" in (run / "report.md").read_text()
    two = playbook("collect_logs.yml", "-l", "node0", inventory=finished.inventory_dir, extra=lab)
    assert two.returncode == 0, tail(two)
    assert (run / "node1" / "launch.log").exists() and (run / "node0" / "launch.log").exists()
    assert "- logs collected from: node0, node1\n" in (run / "report.md").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}


def test_launch_with_a_limit_is_refused_before_anything_starts(finished, lab):
    before = finished.exec("node1", ["cat", "/root/ddplab/last_run"], timeout=30).stdout
    for name in ("launch.yml", "start.yml"):
        proc = playbook(name, "-l", "node1", inventory=finished.inventory_dir,
                        extra={**lab, "ddplab_run_id": "x"})
        assert proc.returncode != 0
        want = "ddplab: error: --limit leaves out node0: a run trains on every node"
        assert want in proc.stdout, tail(proc)
        assert "Traceback" not in proc.stdout + proc.stderr
    assert finished.exec("node1", ["cat", "/root/ddplab/last_run"], timeout=30).stdout == before


def test_a_limit_that_matches_no_node_fails(finished, lab):
    proc = playbook("status.yml", "-l", "nosuchnode", inventory=finished.inventory_dir, extra=lab)
    assert proc.returncode != 0
    assert "nosuchnode" in proc.stdout + proc.stderr


def test_a_launch_restores_code_edited_on_a_node_then_status_and_stop_limit_its_run(finished, lab):
    """Every node passed the checks with these inputs (their records), but a file of the code was edited on
    node1 since: the launch checks the nodes again and prepare restores the file (a skip that trusted the
    record alone would train on the edited file). status and stop then work on part of its live run."""
    inv = finished.inventory_dir
    train = "/root/ddplab/code/trainer/train.py"
    original = finished.exec("node1", ["cat", train], timeout=30, check=True).stdout
    finished.exec("node1", ["sh", "-c", f"echo '# edited on the node' >> {train}"], timeout=30, check=True)
    start = playbook("launch.yml", inventory=inv, timeout=420,
                     extra={**lab, "ddplab_trainer_steps": 100000, "ddplab_run_id": "lim-live"})
    assert start.returncode == 0, tail(start)
    try:
        headers = task_headers(start)
        assert any(h.startswith("code_sync : ") for h in headers), "\n".join(headers)
        assert finished.exec("node1", ["cat", train], timeout=30, check=True).stdout == original
        time.sleep(3)
        st = playbook("status.yml", "-l", "node1", inventory=inv, extra=lab)
        assert st.returncode == 0, tail(st)
        got = rows(st)
        assert got == {"node0": "not asked (left out by --limit)", "node1": "running"}, tail(st)
        stop = playbook("stop.yml", "-l", "node1", inventory=inv, extra=lab)
        assert stop.returncode == 0, tail(stop)
        want = "the ranks on node0 were not asked (--limit): they stop on their own"
        assert want in stop.stdout, tail(stop)
    finally:
        done = playbook("stop.yml", inventory=inv, extra=lab)
        assert done.returncode == 0, tail(done)


def test_prepare_limit_brings_a_wiped_node_back(finished, lab):
    inv = finished.inventory_dir
    node0_addr = finished.host("node0").addr
    finished.exec("node1", ["rm", "-rf", "/root/ddplab"], timeout=30, check=True)
    finished.exec("node1", ["ufw", "--force", "reset"], timeout=60, check=True)
    prep = playbook("prepare.yml", "-l", "node1", inventory=inv, timeout=600, extra=lab)
    assert prep.returncode == 0, tail(prep)
    rules = finished.exec("node1", ["ufw", "show", "added"], timeout=30).stdout
    for rule in peer_rules(node0_addr, node0_addr, ephemeral_ports(finished, "node1")):
        assert rule in rules, rules
    run = playbook("launch.yml", inventory=inv, timeout=420,
                   extra={**lab, "ddplab_wait": "true", "ddplab_trainer_steps": 3, "ddplab_run_id": "lim-b"})
    assert run.returncode == 0, tail(run)
    summary = json.loads((lab["ddplab_runs_dir"] / "lim-b" / "summary.json").read_text())
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    # node1's record of passed checks went with its lab folder: the launch checked the nodes again
    assert any(h.startswith("preflight : ") for h in task_headers(run)), tail(run)


def test_a_relaunch_on_an_unchanged_lab_neither_checks_nor_prepares(finished, lab):
    """The README's relaunch on a prepared, unchanged lab (every node passed the checks with these inputs):
    one plan, no empty play, nothing checked or prepared, at most RELAUNCH_TASK_HEADERS tasks shown (issue
    48: 61 before), and no Ansible module run on any node (-vvv names each module it sends; the collect's
    fetch ran the stat module on every node, about 2 s of a loaded 2-host relaunch)."""
    run = playbook("launch.yml", "-vvv", inventory=finished.inventory_dir, timeout=420,
                   extra={**lab, "ddplab_wait": "true", "ddplab_trainer_steps": 1, "ddplab_run_id": "lim-d"})
    assert run.returncode == 0, tail(run)
    assert "Using module file" not in run.stdout, "\n".join(
        ln for ln in run.stdout.splitlines() if ln.startswith(("TASK [", "Using module file")))
    for host in ("node0", "node1"):  # the archive went once fetched
        assert finished.exec(host, ["test", "-e", "/root/ddplab/collect.tgz"], timeout=30).returncode == 1
    summary = json.loads((lab["ddplab_runs_dir"] / "lim-d" / "summary.json").read_text())
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    headers = task_headers(run)
    assert empty_plays(run) == [] and "skipping: no hosts matched" not in run.stdout, tail(run)
    assert len(headers) <= RELAUNCH_TASK_HEADERS, "\n".join(headers)
    steps = ("preflight", "node_prereqs", "torch_env", "code_sync", "dataset", "firewall")
    assert not any(h.startswith(steps) for h in headers), "\n".join(headers)
    assert sum("Validating arguments" in h for h in headers) == 0, "\n".join(headers)
    # the plan's ready probe said each node's home folder: lab_facts does not ask again
    assert not any(h.startswith("lab_facts : Read the home folder") for h in headers), "\n".join(headers)


@pytest.mark.parametrize("chosen,other", [("node1", "node0"), ("node0", "node1")])
def test_preflight_limit_checks_the_chosen_node_and_says_what_it_left_out(finished, lab, chosen, other):
    proc = playbook("preflight.yml", "-l", chosen, inventory=finished.inventory_dir,
                    extra={**lab, "preflight_debug_dump": "true"})
    assert proc.returncode == 0, tail(proc)
    assert f"not asked (--limit): {other}; only the links between them and the chosen nodes" in proc.stdout
    assert "preflight: ok" in proc.stdout and "Traceback" not in proc.stdout + proc.stderr
    hosts = json.loads((lab["ddplab_runs_dir"] / "preflight" / "latest.json").read_text())["hosts"]
    for check in ("tcp_master", "tcp_peers"):  # real link rows toward the left-out node, both directions
        assert hosts[other][check]["status"] == "ok" and hosts[chosen][check]["status"] == "ok", hosts
    assert hosts[other]["torch"]["status"] == "n/a"
    # the listener the left-out node opened for the chosen node was stopped
    dump = lab["ddplab_runs_dir"] / "preflight" / "input" / chosen / "tcp_peers.json"
    port = json.loads(dump.read_text())["targets"][other]["port"]
    listening = finished.exec(other, ["ss", "-Htln", f"sport = :{port}"], timeout=30).stdout
    assert listening.strip() == "", listening


def test_preflight_limit_names_a_firewalled_link_toward_a_left_out_node(finished, lab):
    node1_addr = finished.host("node1").addr
    rule = ["INPUT", "-s", node1_addr, "-p", "tcp", "-m", "conntrack", "--ctstate", "NEW", "-j", "DROP"]
    finished.exec("node0", ["iptables", "-I", *rule], timeout=30, check=True)
    try:
        proc = playbook("preflight.yml", "-l", "node1", inventory=finished.inventory_dir, extra=lab)
    finally:
        finished.exec("node0", ["iptables", "-D", *rule], timeout=30, check=True)
    assert proc.returncode != 0
    assert "FAIL node0 tcp_peers: node1 -> node0" in proc.stdout, tail(proc)
    assert f"fix: sudo ufw allow from {node1_addr}  # on node0" in proc.stdout, tail(proc)
    assert "Traceback" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("silent,chosen", [("node0", "node1"), ("node1", "node0")])
def test_preflight_limit_names_a_left_out_node_that_does_not_answer(finished, lab, silent, chosen):
    finished.sshd(silent, "stop", cut=True)
    try:
        proc = playbook("preflight.yml", "-l", chosen, inventory=finished.inventory_dir, extra=lab)
        status = playbook("status.yml", "-l", chosen, inventory=finished.inventory_dir, extra=lab)
    finally:
        finished.sshd(silent, "start")
    assert proc.returncode != 0
    want = f"FAIL {silent} ssh: {silent} (left out by --limit) did not answer over SSH, so its links with "
    assert want + chosen in proc.stdout, tail(proc)
    assert "Traceback" not in proc.stdout + proc.stderr
    if silent == "node0":  # status needs the master's lab folder: one line naming it, not a silent stop
        assert status.returncode != 0
        want = "ddplab: error: node0 (the master, left out by --limit) did not answer over SSH"
        assert want in status.stdout, tail(status)
    else:
        assert status.returncode == 0, tail(status)


def test_role_readme_examples_run_as_typed_on_the_finished_lab(finished, lab, tmp_path):
    """The README examples of the roles that read or tidy a finished lab run as typed, as one playbook of
    their plays, with nothing to change (tests/test_role_readmes.py checks every example's syntax and what
    it lists)."""
    from tests.helpers.playbooks import BIN, REPO
    from tests.test_role_readmes import EXAMPLES

    book = tmp_path / "examples.yml"
    cheap = ("lab_facts", "ddplab", "gloo_network", "stale_processes")
    book.write_text("".join(EXAMPLES[role] for role in cheap))
    argv = [str(BIN / "ansible-playbook"), str(book), "-i", str(finished.inventory_dir),
            "-e", f"ddplab_repo_dir={REPO}", "-e", f"ddplab_run_id={RUN}"]
    for key, value in lab.items():
        argv += ["-e", f"{key}={value}"]
    proc = subprocess.run(argv, cwd=REPO, text=True, capture_output=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    assert proc.returncode == 0, tail(proc)
    assert recap(proc) == {host: {"ok": recap(proc)[host]["ok"], "changed": 0, "unreachable": 0, "failed": 0}
                           for host in ("node0", "node1")}, tail(proc)
