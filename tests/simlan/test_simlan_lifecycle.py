"""simlan's lifecycle and failure switches: ufw stays inside a host, link shaping and CPU placement,
sshd stop/start, kill-host, `down` (twice), a failed `up` leaves nothing, and the one-line errors."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from simlan import cluster as simlan
from simlan.network import BRIDGE, host_addr, netns_exists, netns_name
from simlan.system import is_alive, missing_tools

pytestmark = pytest.mark.simlan

REPO = Path(__file__).resolve().parents[2]
PORT = 46000 + os.getpid() % 1000


def _connects(cluster, src: str, dst_addr: str, port: int, timeout: float = 2.0) -> bool:
    code = f"import socket; socket.create_connection(({dst_addr!r}, {port}), timeout={timeout}).close()"
    return cluster.exec(src, [cluster.python, "-c", code], timeout=timeout + 20).returncode == 0


def _listen(cluster, node: str, addr: str, port: int) -> subprocess.Popen:
    server = textwrap.dedent(f"""
        import socket
        s = socket.create_server(({addr!r}, {port}))
        s.settimeout(30)
        print("listening", flush=True)
        while True:
            s.accept()[0].close()
    """)
    proc = cluster.popen(node, [cluster.python, "-c", server], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "listening"
    return proc


def _digest(paths) -> dict:
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths if p.is_file()}


def _real_rules() -> list[str]:
    """This machine's iptables rules, less the egress chains of simulated labs (simlan/egress.py): a parallel
    test worker's stock lab adds or removes its own SIMLAN<N>-FWD/NAT chain at any moment."""
    rules = subprocess.run(["iptables", "-S"], capture_output=True, text=True, timeout=30).stdout
    return [ln for ln in rules.splitlines() if not re.search(r"\bSIMLAN\d+-(FWD|NAT)\b", ln)]


def test_ufw_in_a_host_does_not_touch_the_real_firewall(simlan_cluster):
    if shutil.which("ufw", path=f"{os.environ.get('PATH', '')}:/usr/sbin") is None:
        pytest.skip("ufw (Debian package ufw) is not installed")
    # Fresh hosts: a cluster an earlier test of this worker prepared keeps ddplab's ufw rules (node0 allowed
    # to node1's ephemeral port range, which holds PORT), and enabling ufw would load them.
    simlan2 = simlan_cluster(2, fresh=True)
    real_files = [*Path("/etc/ufw").rglob("*"), Path("/etc/default/ufw")]
    before_rules = _real_rules()
    before_files = _digest(real_files)
    listener = _listen(simlan2, "node1", host_addr(1), PORT)
    try:
        assert _connects(simlan2, "node0", host_addr(1), PORT)  # open before ufw
        simlan2.exec("node1", ["sh", "-c", "ufw default deny incoming && ufw allow 22/tcp && "
                               "ufw --force enable"], timeout=60, check=True)
        assert not _connects(simlan2, "node0", host_addr(1), PORT)  # dropped by node1's ufw
        ssh = subprocess.run(simlan2.ssh_argv("node1", "hostname"), capture_output=True, text=True,
                             timeout=30)
        assert ssh.stdout.strip() == "node1", ssh.stderr  # ssh stays allowed
        assert "Status: active" in simlan2.exec("node1", ["ufw", "status"], check=True).stdout
        after_rules = _real_rules()
        assert after_rules == before_rules
        assert _digest(real_files) == before_files
    finally:
        listener.kill()
        listener.wait(timeout=10)
        simlan_cluster.discard()


def test_link_shaping_and_cpu_placement(simlan_cluster):
    c = simlan_cluster(2, rate="200mbit", cpus="auto")
    allowed = sorted(os.sched_getaffinity(0))
    for i, h in enumerate(c.hosts):
        qdisc = c.exec(h.name, ["tc", "qdisc", "show", "dev", "eth0"], check=True).stdout
        assert "qdisc tbf" in qdisc and "rate 200Mbit" in qdisc
        want = {allowed[i % len(allowed)]}
        assert os.sched_getaffinity(h.pid1) == want
        # A process started over SSH inherits the placement from the host's PID 1.
        ssh = subprocess.run(c.ssh_argv(h.name, "grep Cpus_allowed_list /proc/self/status"),
                             capture_output=True, text=True, timeout=30)
        assert ssh.stdout.split()[-1] == str(want.pop()), ssh.stderr


def test_sshd_stop_and_start(simlan2, simlan_cli):
    assert simlan_cli("sshd", "node1", "stop").returncode == 0
    assert not simlan.ssh_answers(host_addr(1), timeout=1)
    status = simlan_cli("status")
    assert status.returncode == 1 and "stopped" in status.stdout
    assert simlan2.exec("node1", ["hostname"]).stdout.strip() == "node1"  # the host itself is fine
    assert simlan_cli("sshd", "node1", "start").returncode == 0
    ssh = subprocess.run(simlan2.ssh_argv("node1", "hostname"), capture_output=True, text=True, timeout=30)
    assert ssh.stdout.strip() == "node1", ssh.stderr
    assert simlan_cli("status").returncode == 0


def test_kill_host_ends_every_process_of_that_host(simlan2, simlan_cluster, simlan_cli):
    try:
        node1 = simlan2.host("node1")
        sleeper = simlan2.popen("node1", ["sleep", "600"])
        proc = simlan_cli("kill-host", "node1")
        assert proc.returncode == 0, proc.stderr
        assert not is_alive(node1.pid1, node1.pid1_start)
        assert sleeper.wait(timeout=10) != 0  # killed with its host
        assert not _connects(simlan2, "node0", host_addr(1), 22)
        assert simlan2.host("node0").alive
        status = simlan_cli("status")
        assert status.returncode == 1 and "dead" in status.stdout
    finally:
        simlan_cluster.discard()


def _ticks(cluster, host) -> list[float]:
    return [float(x) for x in cluster.exec(host, ["cat", "/tmp/ticks"], timeout=30).stdout.split()]


# A parent that never reaps its child: the child stays a zombie, as one does whose parent was frozen first.
ZOMBIE = "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(600)"


def _until(cluster, host, script: str, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while cluster.exec(host, ["sh", "-c", script], timeout=30).returncode != 0:
        assert time.monotonic() < deadline, f"{host}: no {what} after {timeout:g} s"
        time.sleep(0.1)


def test_freeze_stops_every_process_of_a_host_until_thaw_and_down_removes_it(simlan2, simlan_cluster,
                                                                            simlan_cli):
    """A lid that closes: a ticking process inside node1 stops, node1's sshd accepts TCP but says nothing,
    node0 runs on; after the thaw it ticks again. A zombie (no cgroup lists one) does not hold the freeze up.
    `down` with a host frozen ends it and removes its cgroup."""
    try:
        tick = "while :; do date +%s.%N >> /tmp/ticks; sleep 0.1; done"
        for program in (f"bash -c '{tick}'", f"{sys.executable} -c {shlex.quote(ZOMBIE)}"):
            simlan2.exec("node1", ["bash", "-c", f"setsid {program} >/dev/null 2>&1 </dev/null &"],
                         timeout=30, check=True)
        _until(simlan2, "node1", "test -s /tmp/ticks && ps -eo stat=,comm= | grep -q '^Z.*python'",
               "ticks and zombie")
        freeze = simlan_cli("freeze", "node1")
        assert freeze.returncode == 0, freeze.stdout + freeze.stderr
        group = simlan.load().host("node1").freezer
        before = _ticks(simlan2, "node1")  # exec joins from outside: it runs, the frozen ones do not
        time.sleep(1.5)
        assert _ticks(simlan2, "node1") == before
        status = simlan_cli("status")
        assert status.returncode == 1 and "not answering" in status.stdout  # sshd frozen: no banner
        assert simlan2.exec("node0", ["true"], timeout=30).returncode == 0
        assert simlan_cli("thaw", "node1").returncode == 0
        time.sleep(0.5)
        after = _ticks(simlan2, "node1")
        assert len(after) > len(before) and after[len(before)] - before[-1] >= 1.5  # the gap of the freeze
        assert simlan_cli("status").returncode == 0
        assert simlan_cli("freeze", "node1").returncode == 0
        assert simlan_cli("down").returncode == 0  # while frozen
        assert not Path(group).exists()
    finally:
        simlan_cluster.discard()


# node0 -> node1: TCP round trips to an echo server on node1 (delay is added on node1's way back), and
# 1000 UDP datagrams node1 -> node0 (loss).
ECHO = ("import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
        "s.bind(('0.0.0.0', 45998)); s.listen(); c, _ = s.accept()\nwhile (d := c.recv(64)): c.sendall(d)")
PING = ("import json, socket, statistics, sys, time\nc = socket.create_connection((sys.argv[1], 45998), "
        "timeout=10); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1); rtts = []\n"
        "for _ in range(15):\n t = time.perf_counter(); c.sendall(b'x'); c.recv(64)\n"
        " rtts.append((time.perf_counter() - t) * 1e3)\n"
        "print(json.dumps({'rtt_ms': statistics.median(rtts)}))")
UDP_COUNT = 1000


def _udp_received(cluster, sender: str, receiver: str) -> int:
    """Datagrams of UDP_COUNT sent from `sender` that `receiver` got."""
    addr = cluster.host(receiver).addr
    listen = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); "
              "s.bind(('0.0.0.0', 45999)); s.settimeout(3); n = 0\nwhile True:\n try: s.recv(64); n += 1\n"
              " except TimeoutError: break\nprint(n)")
    rx = cluster.popen(receiver, [sys.executable, "-c", listen], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    send = (f"import socket, time; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nfor i in "
            f"range({UDP_COUNT}):\n s.sendto(b'x', ('{addr}', 45999)); time.sleep(0.0005)")
    cluster.exec(sender, [sys.executable, "-c", send], timeout=60, check=True)
    out, _ = rx.communicate(timeout=30)
    return int(out.strip())


def test_link_delay_jitter_and_loss_are_measured_and_cleared(simlan2, simlan_cli):
    """simlan link (simlan/wifi.py: NFQUEUE, as this kernel has no netem): node1's outgoing packets wait
    its delay (+ jitter) and some are lost; --clear gives the plain link back."""
    def rtt() -> float:
        echo = simlan2.popen("node1", [sys.executable, "-c", ECHO])
        time.sleep(0.5)
        out = simlan2.exec("node0", [sys.executable, "-c", PING, simlan2.host("node1").addr], timeout=60)
        echo.wait(timeout=30)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["rtt_ms"]

    plain = rtt()
    proc = simlan_cli("link", "node1", "--delay", "40ms", "--jitter", "5ms", "--loss", "10%")
    assert proc.returncode == 0, proc.stderr
    shaped = rtt()
    received = _udp_received(simlan2, "node1", "node0")
    print(f"\n[simlan] node0 -> node1 round trip p50: plain {plain:.1f} ms, node1 at delay 40ms jitter 5ms "
          f"loss 10 %: {shaped:.1f} ms; UDP from node1: {received}/{UDP_COUNT} received")
    assert 40 <= shaped - plain < 40 + 10 + 40  # delay + mean jitter, and room for a loaded machine
    assert 0.82 * UDP_COUNT <= received <= 0.97 * UDP_COUNT
    assert simlan_cli("link", "node1", "--clear").returncode == 0
    assert rtt() < 20 and _udp_received(simlan2, "node1", "node0") == UDP_COUNT
    assert simlan.load().host("node1").link is None
    bad = simlan_cli("link", "node1", "--delay", "fast")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "simlan: error: --delay 'fast': not a time; use e.g. --delay 3ms (us, ms, s)"


def test_down_removes_everything_and_is_safe_twice(simlan2, simlan_cli):
    # simlan2 first: the cluster replaced below is this session's own, never another run's.
    up = simlan_cli("up", "--nodes", "2", "--force")
    assert up.returncode == 0, up.stderr
    c = simlan.load()
    assert c is not None and all(h.alive for h in c.hosts)
    down = simlan_cli("down")
    assert down.returncode == 0, down.stderr
    assert not any(is_alive(h.pid1, h.pid1_start) or is_alive(h.unshare_pid, h.unshare_start)
                   for h in c.hosts)
    assert not any(netns_exists(netns_name(h.name)) for h in c.hosts)
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, timeout=10).returncode != 0
    assert not c.state_dir.exists()
    assert not (c.inventory_dir / "hosts.yml").exists() and not (c.inventory_dir / ".ssh/id_ed25519").exists()
    again = simlan_cli("down")
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def test_up_with_a_cluster_up_says_so(simlan2, simlan_cli):
    same = simlan_cli("up", "--nodes", "2")
    assert same.returncode == 0 and "already up" in same.stdout
    other = simlan_cli("up", "--nodes", "3")
    assert other.returncode == 2
    assert other.stderr.count("\n") == 1 and "--force" in other.stderr
    assert simlan2.healthy()  # untouched


def test_failed_up_leaves_nothing_behind(simlan2, simlan_cli):
    proc = simlan_cli("up", "--nodes", "2", "--rate", "very-fast", "--force")
    assert proc.returncode == 2
    assert proc.stderr.startswith("simlan: error: node0: tc refused rate 'very-fast'")
    assert proc.stderr.count("\n") == 1
    assert simlan.load() is None
    assert not netns_exists(netns_name("node0")) and not netns_exists(netns_name("node1"))
    assert subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True, timeout=10).returncode != 0


def test_not_root_is_one_line(simlan_cli):
    if os.geteuid() != 0:  # the plain CLI already runs unprivileged
        proc = simlan_cli("status")
    else:
        system_python = "/usr/bin/python3"
        if not (shutil.which("setpriv") and os.path.exists(system_python)
                and os.access(REPO, os.R_OK | os.X_OK) and _world_readable(REPO)):
            pytest.skip("needs setpriv, /usr/bin/python3 and a repo readable by nobody")
        proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                               system_python, "-m", "simlan", "up", "--nodes", "2"],
                              cwd=REPO, capture_output=True, text=True, timeout=30,
                              env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert proc.returncode == 2
    assert proc.stderr.startswith("simlan: error: needs root") and proc.stderr.count("\n") == 1
    assert proc.stdout == ""


def _world_readable(path: Path) -> bool:
    return all(p.stat().st_mode & 0o005 == 0o005 for p in [path, *path.parents])


def test_missing_tool_names_the_debian_package():
    msg = missing_tools({"sh": "dash", "simlan-no-such-tool": "simlan-test-package"})
    assert msg == ("missing `simlan-no-such-tool`; install the Debian package(s): "
                   "apt-get install -y simlan-test-package")
    assert missing_tools({"sh": "dash"}) is None
