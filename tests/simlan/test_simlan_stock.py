"""Stock hosts (`up --stock`) look like a fresh Debian 12 install: own root filesystem from the
cached debootstrap tree, login as `lab` with a key, sudo that asks for the password, the stock
127.0.1.1 line, nothing extra installed, and package traffic (only) through NAT. Needs root."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simlan import cluster as simlan
from simlan import cpuquota, egress, rootfs
from simlan.network import netns_exists, netns_name
from simlan.outsider import NAME as OUTSIDE
from simlan.outsider import address as outsider_address
from simlan.outsider import outsider
from simlan.system import missing_requirements, which
from tests.helpers.playbooks import playbook, tail

pytestmark = pytest.mark.simlan

REPO = Path(__file__).resolve().parents[2]
STOCK_QUOTA = {"node1": 50}  # node0 at full speed, node1 at half a core


def stock_skip_reason() -> str | None:
    problem = missing_requirements()
    if problem:
        return f"simlan: {problem}"
    for tool, pkg in (("debootstrap", "debootstrap"), ("iptables", "iptables")):
        if which(tool) is None:
            return f"simlan --stock: missing `{tool}` (apt-get install -y {pkg})"
    return None


def stock_up() -> simlan.Cluster:
    return simlan.up(2, stock=True, cpu_quota=[f"{h}={p}" for h, p in STOCK_QUOTA.items()], force=True,
                     timeout=20)


@pytest.fixture(scope="module")
def simlan_stock():
    """A 2-host stock cluster shared by this module and taken down at its end, so the session's
    root-host factory (tests/conftest.py) never mistakes it for one of its own clusters."""
    reason = stock_skip_reason()
    if reason:
        pytest.skip(reason)
    c = stock_up()
    yield c
    current = simlan.load()
    if current is not None and current.stock:
        simlan.down()


def _ssh(c, node: str, cmd: str, *, user: str | None = None, input: str | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess:
    argv = c.ssh_argv(node, cmd)
    if user:
        argv[-2] = f"{user}@{c.host(node).addr}"
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                          stdin=None if input is not None else subprocess.DEVNULL)


@pytest.fixture(autouse=True)
def _needs_ssh():
    if shutil.which("ssh") is None:
        pytest.skip("OpenSSH client (Debian package openssh-client) is not installed")


def test_stock_host_has_its_own_debian_root(simlan_stock):
    c = simlan_stock
    assert c.stock and c.healthy()
    for h in c.hosts:
        mounts = c.exec(h.name, ["cat", "/proc/self/mounts"], check=True).stdout.splitlines()
        root = next(m.split() for m in mounts if m.split()[1] == "/")
        assert root[2] == "overlay" and f"lowerdir={rootfs.rootfs_dir()}" in root[3]
        assert f"upperdir={h.dir}/upper" in root[3]
        for point, fstype in (("/proc", "proc"), ("/sys", "sysfs"), ("/dev", "tmpfs"), ("/dev/pts", "devpts"),
                              ("/run", "tmpfs"), ("/tmp", "tmpfs")):
            assert any(m.split()[1:3] == [point, fstype] for m in mounts), (point, mounts)
        release = c.exec(h.name, ["cat", "/etc/os-release"], check=True).stdout
        assert 'VERSION_CODENAME=bookworm' in release
        # The real machine's files are not there: the repo and its venv are absent.
        assert c.exec(h.name, ["test", "-e", str(REPO)]).returncode != 0
    assert simlan.load().stock


def test_ssh_as_lab_with_the_key_and_root_is_refused(simlan_stock):
    c = simlan_stock
    for h in c.hosts:
        me = _ssh(c, h.name, "id -un; hostname; echo $HOME; tty || true")
        assert me.returncode == 0, me.stderr
        assert me.stdout.split()[:3] == ["lab", h.name, "/home/lab"]
        root = _ssh(c, h.name, "id -un", user="root")
        assert root.returncode == 255 and "Permission denied" in root.stderr
    # A terminal works (tmux needs one): devpts in the host.
    argv = c.ssh_argv("node0", "tty")
    argv.insert(1, "-tt")
    tty = subprocess.run(argv, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert tty.stdout.strip().startswith("/dev/pts/"), tty.stderr


def test_sudo_needs_the_password(simlan_stock):
    c = simlan_stock
    ok = _ssh(c, "node1", "sudo -S -p '' id -u", input=f"{c.become_password}\n")
    assert (ok.returncode, ok.stdout.strip()) == (0, "0"), ok.stderr
    without = _ssh(c, "node1", "sudo -n id -u")
    assert without.returncode != 0 and "password is required" in without.stderr
    wrong = _ssh(c, "node1", "sudo -S -p '' id -u", input="not-the-password\n")
    assert wrong.returncode != 0 and wrong.stdout == ""
    # From the group sudo (the stock %sudo rule), not a NOPASSWD entry.
    rules = c.exec("node1", ["sh", "-c", "cat /etc/sudoers /etc/sudoers.d/* 2>/dev/null"], check=True).stdout
    assert "NOPASSWD" not in rules and "%sudo\tALL=(ALL:ALL) ALL" in rules
    assert "sudo" in c.exec("node1", ["id", "-Gn", "lab"], check=True).stdout.split()


def test_etc_hosts_has_the_stock_loopback_line(simlan_stock):
    c = simlan_stock
    for h in c.hosts:
        hosts = c.exec(h.name, ["cat", "/etc/hosts"], check=True).stdout
        assert f"127.0.1.1\t{h.name}" in hosts.splitlines()
        assert all(f"{x.addr}\t{x.name}" in hosts for x in c.hosts)
        # As on a fresh install, the hostname resolves to loopback first (the trap issue 12 describes).
        first = c.exec(h.name, ["getent", "hosts", h.name], check=True).stdout.split()
        assert first[:2] == ["127.0.1.1", h.name]
        assert c.exec(h.name, ["hostname"], check=True).stdout.strip() == h.name


def test_nothing_but_the_stock_packages(simlan_stock):
    c = simlan_stock
    check = ("for p in tmux rsync python3-venv ufw openssh-server sudo python3 iproute2 procps; do "
             "if dpkg-query -W -f='${Status}' $p 2>/dev/null | grep -q 'ok installed'; then echo yes; "
             "else echo no; fi; done")
    seen = c.exec("node0", ["sh", "-c", check], check=True).stdout.split()
    assert seen == ["no"] * 4 + ["yes"] * 5
    assert c.exec("node0", ["sh", "-c", "command -v tmux rsync"]).stdout == ""
    assert c.exec("node0", ["python3", "-c", "import torch"]).returncode != 0
    venv = c.exec("node0", ["python3", "-m", "venv", "/tmp/v"])
    assert venv.returncode != 0 and "ensurepip" in venv.stdout + venv.stderr
    # No ddplab state: the login user's home holds only the skeleton and its key.
    home = _ssh(c, "node0", "ls -A ~").stdout.split()
    assert sorted(home) == [".bash_logout", ".bashrc", ".profile", ".ssh"]
    assert c.exec("node0", ["sh", "-c", "ls -d /root/ddplab /home/lab/ddplab /opt/ddplab"]).returncode != 0


def test_stock_inventory(simlan_stock):
    c = simlan_stock
    path = c.inventory_dir / "group_vars/all/simlan.yml"
    gv = yaml.safe_load(path.read_text())
    assert gv["ansible_user"] == "lab"
    assert gv["ansible_become_password"] == c.become_password
    assert gv["ansible_python_interpreter"] == "/usr/bin/python3"
    assert "rehearsal" in path.read_text()  # the comment that says why a password sits here
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ansible = REPO / ".venv/bin/ansible"
    if not ansible.exists():
        pytest.skip("ansible is not installed in .venv")
    proc = subprocess.run([str(ansible), "-i", str(c.inventory_dir), "all", "-b", "-m",
                           "ansible.builtin.command", "-a", "id -un"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("| CHANGED | rc=0 >>\nroot") == 2, proc.stdout


def test_cpu_quota_is_applied_to_every_process_of_the_host(simlan_stock, simlan_cli):
    c = simlan_stock
    node1, node0 = c.host("node1"), c.host("node0")
    assert node0.cgroup is None and node1.cgroup is not None
    assert cpuquota.percent(node1.cgroup) == STOCK_QUOTA["node1"]
    cg = Path(node1.cgroup)
    if (cg / "cpu.max").exists():
        assert (cg / "cpu.max").read_text().split() == ["50000", "100000"]
    else:  # the cpu controller is on a cgroup v1 hierarchy (hybrid machine)
        assert (cg / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cg / "cpu.cfs_period_us").read_text().strip() == "100000"
    members = cpuquota.members(node1.cgroup)
    assert node1.pid1 in members and node1.unshare_pid in members
    # A login and the processes it starts are born in it.
    login = _ssh(c, "node1", "cat /proc/self/cgroup")
    assert f"/simlan{os.environ.get('SIMLAN_LAB', '0') or '0'}/node1" in login.stdout, login.stdout
    # `exec` joins it too. CFS allows at most ~50 ms of CPU per 100 ms period (plus a tick of slack), so a
    # busy loop needs ~2x its CPU time in wall time however busy the machine is (contention only adds wall).
    loop = ("import time; w=time.perf_counter(); n=0\n"
            "while time.process_time() < 0.6: n+=1\n"
            "print(time.perf_counter()-w, time.process_time())")
    wall, cpu = map(float, c.exec("node1", ["python3", "-c", loop], check=True).stdout.split())
    assert wall >= 1.6 * cpu - 0.1, (wall, cpu)
    status = simlan_cli("status")
    assert status.returncode == 0, status.stderr
    assert [line.split()[-1] for line in status.stdout.splitlines()[1:]] == ["-", "50%"]


def test_package_traffic_only(simlan_stock):
    c = simlan_stock
    rec = c.egress
    assert rec and rec["allowed"]["web"]
    rules = subprocess.run(["iptables", "-w", "-S", rec["fwd_chain"]], capture_output=True, text=True,
                           timeout=30).stdout
    assert rules.strip().splitlines()[-2:] == [f"-A {rec['fwd_chain']} -i lab{_lab()} -j DROP",
                                               f"-A {rec['fwd_chain']} -o lab{_lab()} -j DROP"]
    registry = rec["allowed"]["web"][0]
    probe = ("import socket, sys\n"
             "for a, p in [(sys.argv[1], 80), (sys.argv[1], 22), (sys.argv[2], 80)]:\n"
             "    try:\n        socket.create_connection((a, p), timeout=3).close(); print('open')\n"
             "    except OSError: print('blocked')\n")
    # The bridge's own gateway in the root namespace is local traffic; another address on the real
    # network (the default gateway of this machine) must not be reachable through the NAT.
    gateway = subprocess.run(["ip", "-4", "route", "show", "default"], capture_output=True, text=True,
                             timeout=10).stdout.split()[2]
    seen = c.exec("node0", ["python3", "-c", probe, registry, gateway], timeout=60).stdout.split()
    assert seen == ["open", "blocked", "blocked"]


def _lab() -> str:
    return os.environ.get("SIMLAN_LAB", "0") or "0"


@pytest.mark.slow
def test_apt_install_tmux_with_sudo(simlan_stock):
    c = simlan_stock
    cmd = ("sudo -S -p '' sh -c 'apt-get -q update >/dev/null && "
           "DEBIAN_FRONTEND=noninteractive apt-get install -y -q tmux >/dev/null' && tmux -V")
    proc = _ssh(c, "node0", cmd, input=f"{c.become_password}\n", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().startswith("tmux 3.")
    assert _ssh(c, "node1", "command -v tmux").returncode != 0  # the other host is untouched
    assert not (rootfs.rootfs_dir() / "usr/bin/tmux").exists()  # and so is the shared cache


@pytest.mark.slow
def test_a_stock_host_switched_on_again_keeps_its_user_and_host_key(simlan_stock, simlan_cli):
    """As a machine that reboots: the first boot's user, password and host key stay (init.sh makes them
    once), so `lab` logs in again and a known_hosts entry still matches."""
    c = simlan_stock
    key = c.exec("node1", ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"], check=True).stdout
    assert simlan_cli("kill-host", "node1").returncode == 0
    revived = simlan_cli("revive-host", "node1")
    assert revived.returncode == 0, revived.stderr
    again = simlan.load()
    assert again.host("node1").pid1 != c.host("node1").pid1
    assert _ssh(again, "node1", "id -un").stdout.strip() == "lab"
    assert again.exec("node1", ["cat", "/etc/ssh/ssh_host_ed25519_key.pub"], check=True).stdout == key


@pytest.mark.slow
def test_down_then_up_reuses_the_cache(simlan_stock, simlan_cli):
    c = simlan_stock
    stamp = rootfs.stamp()
    assert stamp and rootfs.is_ready()
    # a test that died inside `with outsider(...)`: its host outside the lab is left on the LAN
    outside = outsider(simlan.load(), programs_of="node1")
    argv = outside.__enter__()
    assert subprocess.run(argv + ["ip", "-br", "addr", "show", "eth0"], capture_output=True, text=True,
                          timeout=30).stdout.split()[2] == f"{outsider_address()}/24"
    started = time.monotonic()
    down = simlan_cli("down")
    down_s = time.monotonic() - started
    assert down.returncode == 0, down.stderr
    assert subprocess.run(["iptables", "-w", "-S"], capture_output=True, text=True,
                          timeout=30).stdout.count("SIMLAN" + _lab()) == 0
    assert subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True, text=True,
                          timeout=30).stdout.count("SIMLAN" + _lab()) == 0
    # put back, unless another lab (a parallel test worker's) still forwards for its stock hosts
    others = re.findall(r"^-N SIMLAN\d+-FWD$", subprocess.run(["iptables", "-w", "-S"], capture_output=True,
                                                             text=True, timeout=30).stdout, flags=re.M)
    if c.egress["forward_was"] == "0" and not others:
        assert Path(egress.IP_FORWARD).read_text().strip() == "0"
    assert not Path(c.host("node1").cgroup).exists()
    assert not netns_exists(netns_name(OUTSIDE))  # down removed the outside host too
    started = time.monotonic()
    again = stock_up()
    up_s = time.monotonic() - started
    assert again.healthy()
    assert rootfs.stamp() == stamp  # not rebuilt
    print(f"\nstock cache: built once in {stamp['build_seconds']} s ({stamp['bytes'] / 1e6:.0f} MB); "
          f"down {down_s:.2f} s; up --stock with the cache {up_s:.2f} s")
    assert up_s < 15


def test_a_debian_13_host_beside_a_debian_12_one(simlan_stock, tmp_path):
    """`--release node1=trixie`: node1 is a fresh Debian 13 (its own cached tree, built once from the same
    mirror), node0 stays Debian 12; both log in as `lab`, and preflight on the bare pair reads each one's
    python3 over SSH."""
    mixed = simlan.up(2, stock=True, release=["node1=trixie"], force=True, timeout=20)
    assert mixed.healthy() and mixed.releases == {"node1": "trixie"}
    assert rootfs.is_ready(suite="trixie") and rootfs.stamp("trixie")["recipe"]["suite"] == "trixie"
    want = {"node0": ("bookworm", "Python 3.11", "OpenSSH_9"),
            "node1": ("trixie", "Python 3.13", "OpenSSH_10")}
    for host, (suite, python, openssh) in want.items():
        mounts = mixed.exec(host, ["cat", "/proc/self/mounts"], check=True).stdout.splitlines()
        root = next(m.split() for m in mounts if m.split()[1] == "/")
        assert f"lowerdir={rootfs.rootfs_dir(suite)}" in root[3]
        assert f"VERSION_CODENAME={suite}" in mixed.exec(host, ["cat", "/etc/os-release"], check=True).stdout
        me = _ssh(mixed, host, "id -un; python3 -V; ssh -V 2>&1")
        assert me.returncode == 0, me.stderr
        lines = me.stdout.splitlines()
        assert lines[0] == "lab" and lines[1].startswith(python) and lines[2].startswith(openssh), lines
    # preflight on the bare pair, with a wheelhouse filled for Python 3.11 only: node1's Python is named with
    # the command that fills it, node0 (served) only needs prepare
    torch = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    (tmp_path / "wheelhouse").mkdir()
    (tmp_path / "wheelhouse/manifest.json").write_text(json.dumps({
        "torch": "2.13.0", "files": [{"file": torch, "size": 1, "sha256": "0" * 64}],
        "torch_wheels": {"3.11 x86_64": [torch]}}))
    extra = {"ddplab_wheelhouse_dir": tmp_path / "wheelhouse", "ddplab_runs_dir": tmp_path / "runs"}
    proc = playbook("preflight.yml", inventory=mixed.inventory_dir, timeout=300, extra=extra)
    verdict = json.loads((tmp_path / "runs/preflight/latest.json").read_text())
    fails = {f["host"]: f for f in verdict["failures"]}
    assert proc.returncode != 0 and set(fails) == {"node0", "node1"}, tail(proc)
    assert "(its python3: 3.11 x86_64)" in fails["node0"]["detail"] and "prepare.yml" in fails["node0"]["fix"]
    assert "its python 3.13 x86_64 has no torch 2.13.0 wheel" in fails["node1"]["detail"]
    assert fails["node1"]["fix"] == 'make wheelhouse PYTHONS="3.13"  # then run playbooks/prepare.yml'
    bad = subprocess.run([sys.executable, "-m", "simlan", "up", "--nodes", "2", "--stock", "--release",
                          "node1=sid"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert bad.returncode == 2, bad.stderr
    assert "unknown Debian release 'sid'; allowed: bookworm (12), trixie (13)" in bad.stderr


# ---- pure logic (no root) ----

def test_rootfs_cache_is_ready_only_with_a_matching_stamp(tmp_path, monkeypatch):
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    want = {"version": rootfs.RECIPE_VERSION, "suite": "bookworm", "mirror": "http://m/debian"}
    assert not rootfs.is_ready(want)  # nothing
    rootfs.rootfs_dir().mkdir()
    assert not rootfs.is_ready(want)  # a tree without a stamp: an interrupted build
    rootfs.stamp_path().write_text(json.dumps({"recipe": {**want, "mirror": "http://other/debian"}}))
    assert not rootfs.is_ready(want)  # another recipe
    rootfs.stamp_path().write_text(json.dumps({"recipe": want}))
    assert rootfs.is_ready(want)


def test_a_failed_build_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(rootfs, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(rootfs, "which", lambda tool: "/bin/false")
    with pytest.raises(rootfs.SimlanError, match="debootstrap failed"):
        rootfs._build({"suite": "bookworm", "mirror": "http://m/debian", "security_mirror": None},
                      log=lambda m: None)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_debian_mirror_from_the_apt_sources(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    (tmp_path / "sources.list").write_text("# deb http://old/debian bookworm main\n")
    (tmp_path / "d/other.list").write_text("deb [arch=amd64] https://packages.example/apt stable main\n")
    (tmp_path / "d/debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://mirror.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n")
    monkeypatch.setattr(rootfs, "APT_SOURCES", (tmp_path / "sources.list", tmp_path / "d"))
    assert rootfs.debian_mirrors() == ("http://mirror.example/debian", "http://mirror.example/debian-security")
    (tmp_path / "d/debian.sources").unlink()
    with pytest.raises(rootfs.SimlanError, match="no `deb` entry for suite bookworm"):
        rootfs.debian_mirrors()


def test_nat_rules_allow_only_the_registries_and_dns():
    fwd, nat = egress.rules({"registries": ["deb.debian.org"], "web": ["198.51.100.7"], "dns": ["10.0.0.53"]})
    src = egress.subnet()
    assert nat == [
        ["-s", src, "-d", "198.51.100.7/32", "-p", "tcp", "-m", "multiport", "--dports", "80,443",
         "-j", "MASQUERADE"],
        ["-s", src, "-d", "10.0.0.53/32", "-p", "udp", "--dport", "53", "-j", "MASQUERADE"],
        ["-s", src, "-d", "10.0.0.53/32", "-p", "tcp", "--dport", "53", "-j", "MASQUERADE"],
    ]
    accepts = [r for r in fwd if r[-1] == "ACCEPT" and "conntrack" not in r]
    assert accepts == [["-i", egress.network.BRIDGE, *r[:-2], "-j", "ACCEPT"] for r in nat]
    bridge = egress.network.BRIDGE
    assert fwd[-2:] == [["-i", bridge, "-j", "DROP"], ["-o", bridge, "-j", "DROP"]]


def test_cpu_quota_parse_and_settings():
    assert cpuquota.parse(["node1=50", "node0=100"], ["node0", "node1"]) == {"node1": 50, "node0": 100}
    assert cpuquota.settings(50) == {"v2": "50000 100000", "v1_period": "100000", "v1_quota": "50000"}
    assert cpuquota.settings(35)["v2"] == "35000 100000"
    for bad, why in (("node1", "not HOST=PERCENT"), ("node1=half", "not HOST=PERCENT"),
                     ("node7=50", "no host 'node7'"), ("node1=0", "outside 1-")):
        with pytest.raises(cpuquota.SimlanError, match=why) as err:
            cpuquota.parse([bad], ["node0", "node1"])
        assert err.value.code == 2 and "\n" not in str(err.value)


def test_release_parse():
    assert rootfs.parse_releases(["node1=trixie", "node0=12"], ["node0", "node1"]) == {"node1": "trixie"}
    assert rootfs.parse_releases(["node1=13"], ["node0", "node1"]) == {"node1": "trixie"}
    for spec, words in (("node2=trixie", "not HOST=RELEASE with one of the hosts (node0, node1)"),
                        ("node1", "not HOST=RELEASE"), ("node1=buster", "unknown Debian release 'buster'")):
        with pytest.raises(rootfs.SimlanError, match=re.escape(words)):
            rootfs.parse_releases([spec], ["node0", "node1"])
