"""Simulated hosts behave like separate machines: own name, files, firewall dir, lab folder and
network address, reached over real SSH and TCP. Needs root (skips otherwise)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from simlan.network import host_addr
from tests.helpers import leftovers

A0, A1 = host_addr(0), host_addr(1)  # 10.77.<lab>.10/.11

pytestmark = pytest.mark.simlan

REPO = Path(__file__).resolve().parents[2]


def test_each_host_has_its_own_name_and_etc_hosts(simlan2):
    for h in simlan2.hosts:
        out = simlan2.exec(h.name, ["sh", "-c", "hostname; cat /etc/hostname; getent hosts $(hostname)"],
                           check=True).stdout.split("\n")
        assert out[0] == h.name and out[1] == h.name
        # The hostname resolves to the LAN address, not loopback (gloo depends on it).
        assert out[2].split() == [h.addr, h.name]
    hosts_file = simlan2.exec("node1", ["cat", "/etc/hosts"], check=True).stdout
    assert f"{A0}\tnode0" in hosts_file and f"{A1}\tnode1" in hosts_file
    assert "node1" not in Path("/etc/hosts").read_text().split()


def test_files_written_in_a_host_stay_in_that_host(simlan2, simlan_cluster):
    mark = f"simlan-test-{uuid.uuid4().hex[:8]}"
    paths = [f"/tmp/{mark}", f"/run/{mark}", f"/dev/shm/{mark}", f"/etc/ufw/{mark}",
             f"/var/lib/ddplab/{mark}", f"/root/ddplab/{mark}", f"/root/.ssh/{mark}"]
    real_home_entry = Path(simlan2.real_home) / f".{mark}"  # a file in the real home: hidden in hosts
    try:
        real_home_entry.write_text("real machine only\n")
        simlan2.exec("node0", ["sh", "-c", f"mkdir -p /root/ddplab && touch {' '.join(paths)}"], check=True)
        check = "for p in " + " ".join(paths + [str(real_home_entry)]) + \
                "; do if [ -e $p ]; then echo yes; else echo no; fi; done"
        seen_node0 = simlan2.exec("node0", ["sh", "-c", check], check=True).stdout.split()
        seen_node1 = simlan2.exec("node1", ["sh", "-c", check], check=True).stdout.split()
        assert seen_node0 == ["yes"] * len(paths) + ["no"]
        assert seen_node1 == ["no"] * (len(paths) + 1)
        assert [p for p in paths if os.path.exists(p)] == []
    finally:
        real_home_entry.unlink(missing_ok=True)
        simlan_cluster.discard()  # node0's lab folder and /etc/ufw were written to


def test_repo_python_works_inside_hosts(simlan2):
    """Ansible's interpreter on the hosts is the repo's venv Python: the private home keeps it."""
    out = simlan2.exec("node1", [simlan2.python, "-c", "import sys, yaml; print(sys.prefix)"],
                       check=True).stdout.strip()
    assert out == sys.prefix


def test_ssh_login_with_the_cluster_key(simlan2):
    if shutil.which("ssh") is None:
        pytest.skip("OpenSSH client (Debian package openssh-client) is not installed")
    for h in simlan2.hosts:
        proc = subprocess.run(simlan2.ssh_argv(h.name, "hostname; echo $HOME"), capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [h.name, "/root"]


def test_hosts_reach_each_other_over_tcp(simlan2):
    port = 47000 + os.getpid() % 1000
    server = textwrap.dedent(f"""
        import socket
        s = socket.create_server(("{A1}", {port}))
        s.settimeout(20)
        print("listening", flush=True)
        conn, (peer, _) = s.accept()
        conn.sendall(f"{{socket.gethostname()}} saw {{peer}}".encode())
        conn.close()
    """)
    client = textwrap.dedent(f"""
        import socket
        with socket.create_connection(("{A1}", {port}), timeout=10) as c:
            print(c.recv(100).decode())
    """)
    listener = simlan2.popen("node1", [simlan2.python, "-c", server], stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout.readline().strip() == "listening"
        got = simlan2.exec("node0", [simlan2.python, "-c", client], timeout=30, check=True).stdout.strip()
        assert got == f"node1 saw {A0}"
        assert listener.wait(timeout=20) == 0
    finally:
        listener.kill()
        listener.wait(timeout=10)


def test_exec_passes_stdin_and_keeps_exit_code(simlan2, simlan_cli):
    proc = simlan_cli("exec", "node1", "--", "sh", "-c", 'read x; echo "$x from $(hostname)"; exit 7',
                      input="hello\n")
    assert (proc.returncode, proc.stdout) == (7, "hello from node1\n")
    bad = simlan_cli("exec", "node7", "--", "true")
    assert bad.returncode == 2
    assert bad.stderr.splitlines() == [bad.stderr.strip()] and "node7" in bad.stderr


def test_inventory_follows_the_contract(simlan2):
    inv = simlan2.inventory_dir
    tree = yaml.safe_load((inv / "hosts.yml").read_text())
    nodes = tree["all"]["children"]["ddplab_nodes"]["children"]
    assert nodes["ddplab_master"]["hosts"] == {
        "node0": {"ansible_host": A0, "ddplab_addr": A0, "ddplab_node_rank": 0}}
    assert nodes["ddplab_workers"]["hosts"] == {
        "node1": {"ansible_host": A1, "ddplab_addr": A1, "ddplab_node_rank": 1}}
    gv = yaml.safe_load((inv / "group_vars/all/simlan.yml").read_text())
    assert gv["ansible_user"] == "root" and gv["ddplab_simlan"] is True and gv["firewall_enable"] is True
    assert "UserKnownHostsFile=/dev/null" in gv["ansible_ssh_common_args"]
    assert gv["ansible_python_interpreter"] == str(Path(sys.prefix) / "bin" / "python")
    key = Path(gv["ansible_ssh_private_key_file"])
    assert key.is_absolute() and stat.S_IMODE(key.stat().st_mode) == 0o600
    assert key.read_text() == simlan2.key.read_text()

    ansible_inventory = REPO / ".venv/bin/ansible-inventory"
    if not ansible_inventory.exists():
        pytest.skip("ansible-inventory is not installed in .venv")
    proc = subprocess.run([str(ansible_inventory), "-i", str(inv), "--list"], capture_output=True,
                          text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert "Unable to parse" not in proc.stderr  # nothing in the folder but inventory sources
    listed = yaml.safe_load(proc.stdout)
    assert listed["ddplab_master"]["hosts"] == ["node0"]
    assert listed["ddplab_workers"]["hosts"] == ["node1"]


def test_hosts_a_file_left_changed_are_not_handed_to_the_next_file(simlan2, simlan_cluster):
    """tests/conftest.py at the end of each test file: hosts as `simlan up` made them stay for the next file
    of the worker; hosts its tests changed (here: a lab folder, a ufw rule not yet in force, a process) are
    taken down, as one CI run's ufw test found an earlier file's rules in force."""
    assert leftovers.changes(simlan2) == []
    simlan_cluster.discard_if_changed()
    assert simlan_cluster(2).created_at == simlan2.created_at  # kept
    simlan2.exec("node0", ["sh", "-c", "mkdir /root/ddplab && ufw allow from 10.77.0.99 to any port 29500 "
                           "proto tcp >/dev/null"], check=True)
    # the shell returns before its child has become tail (CI saw it still named setsid): wait for the name
    named = "for i in $(seq 300); do pgrep -x tail >/dev/null && exit 0; sleep 0.1; done; exit 1"
    simlan2.exec("node1", ["sh", "-c", f"setsid tail -f /dev/null >/dev/null 2>&1 </dev/null & {named}"],
                 check=True)
    assert leftovers.changes(simlan2) == ["node0: ~/ddplab", "node0: ufw settings", "node1: process tail"]
    simlan_cluster.discard_if_changed()
    assert simlan_cluster(2).created_at != simlan2.created_at  # new hosts
