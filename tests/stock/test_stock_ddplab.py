"""ddplab on stock machines (issue 12): two `simlan up --stock` hosts (Debian 12 minimal, login `lab` with a
sudo password, no tmux/venv/torch/ufw, the stock 127.0.1.1 line, PyPI out of reach) taken from bare to a
trained run by the README's commands, as `lab`, with become only where root is needed.

One cluster serves the module, in order: prepare --check (nothing changes), prepare twice (changed>0,
then 0), a default launch refused (the hosts are open to the LAN: an outsider's knock on the master port),
a launch with firewall_enable (ufw turned on, installed on node1), an outsider dropped during a run,
firewall turned on, firewall cleanup; then sudo's password typed at --ask-become-pass (and
a vaulted one), a live run of another id that prepare refuses unless replace is asked, and root's listener
on the master port named, not killed. node0 starts with ufw installed, inactive, holding the user's own
`limit 22/tcp`.
The times of the first and second prepare are printed (`pytest -s`). The hosts, prepared, then serve
test_slurm.py (tests/stock/conftest.py), so every test here leaves them as a user would have them."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from simlan.outsider import outsider
from tests.helpers.firewall import ephemeral_ports, lab_comment, peer_rules
from tests.helpers.playbooks import BIN, REPO, make_shards, playbook, recap, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]


@pytest.fixture(scope="module")
def stock(stock_hosts, tmp_path_factory):
    """Two bare stock hosts (tests/stock/conftest.py: test_slurm.py gets them next), a wheelhouse and a
    small shard set. At the end the hosts are as a user's prepared ones: ufw inactive with their rule."""
    c = stock_hosts(Path(__file__).name, bare=True)
    # The user's own firewall on node0: ufw installed, inactive, with a rate-limited SSH rule.
    c.exec("node0", ["sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                     "--no-install-recommends ufw >/dev/null && ufw limit 22/tcp >/dev/null"],
           timeout=300, check=True)
    extra = {"ddplab_data_dir": make_shards(tmp_path_factory.getbasetemp() / "shards"),
             "ddplab_runs_dir": tmp_path_factory.mktemp("stock-runs"), "ddplab_threads": 1,
             "ddplab_wait_poll": 10}
    return {"cluster": c, "inv": c.inventory_dir, "extra": extra,
           "addr": {h.name: h.addr for h in c.hosts}, "first": {}}


def as_lab(c, host: str, cmd: str) -> subprocess.CompletedProcess:
    """A command over SSH as the login user `lab` (what Ansible sees)."""
    return subprocess.run(c.ssh_argv(host, cmd), capture_output=True, text=True, timeout=60,
                          stdin=subprocess.DEVNULL)


def ufw_added(c, host: str) -> list[str]:
    out = c.exec(host, ["ufw", "show", "added"], timeout=30, check=True).stdout
    return [line for line in out.splitlines() if line.startswith("ufw ")]


def ufw_active(c, host: str) -> bool:
    return "Status: active" in c.exec(host, ["ufw", "status"], timeout=30, check=True).stdout


@pytest.fixture(scope="module")
def prepared(stock):
    """prepare.yml twice from bare hosts: (first, second) runs and their wall times."""
    t0 = time.monotonic()
    first = playbook("prepare.yml", inventory=stock["inv"], extra=stock["extra"], timeout=900)
    t1 = time.monotonic()
    second = playbook("prepare.yml", inventory=stock["inv"], extra=stock["extra"], timeout=600)
    t2 = time.monotonic()
    print(f"\nstock hosts: first prepare (apt + wheelhouse push + offline torch install) {t1 - t0:.0f} s, "
          f"second prepare {t2 - t1:.0f} s")
    return first, second


def test_check_on_bare_hosts_says_what_it_would_install_and_changes_nothing(stock):
    """The first thing a careful user runs on a machine they care about: prepare.yml --check --diff. It
    ends without an error (apt's own check mode needs python3-apt, which a stock Debian lacks; the shards
    cannot be hashed before the code is there) and leaves the hosts as they were."""
    c = stock["cluster"]
    dry = playbook("prepare.yml", "--check", "--diff", inventory=stock["inv"], extra=stock["extra"],
                   timeout=600)
    assert dry.returncode == 0, tail(dry)
    for host in ("node0", "node1"):
        assert f"{host}: would install tmux, rsync, python3-venv" in dry.stdout, tail(dry)
        left = as_lab(c, host, "test -e ~/ddplab || command -v tmux || command -v rsync "
                               "|| dpkg -s python3-apt >/dev/null 2>&1")
        assert left.returncode != 0, f"{host}: {left.stdout}"


def test_prepare_installs_as_lab_then_changes_nothing(stock, prepared):
    first, second = prepared
    assert first.returncode == 0, tail(first)
    assert re.search(r"node1: pushing \d+ wheel\(s\), \d+ MB of \d+ MB", first.stdout), tail(first)
    changed = {h: r["changed"] for h, r in recap(first).items() if h.startswith("node")}
    assert changed.keys() == {"node0", "node1"} and all(n > 0 for n in changed.values()), tail(first)
    assert second.returncode == 0, tail(second)
    assert {h: r["changed"] for h, r in recap(second).items() if h.startswith("node")} == \
        {"node0": 0, "node1": 0}, tail(second)


def test_nodes_have_tmux_venv_and_the_exact_torch_owned_by_lab(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    for host in ("node0", "node1"):
        got = as_lab(c, host, "command -v tmux rsync ss; python3 -c 'import ensurepip'; cat ~/ddplab/python; "
                     "~/ddplab/venv/bin/python -c 'import torch, numpy, pyarrow; print(torch.__version__)'; "
                     "stat -c %U ~/ddplab ~/ddplab/venv ~/ddplab/wheelhouse; "
                     "find ~/ddplab ! -user lab | wc -l; stat -c %a ~/ddplab")
        assert got.returncode == 0, got.stderr
        lines = got.stdout.split()
        assert lines[:3] == ["/usr/bin/tmux", "/usr/bin/rsync", "/usr/bin/ss"], got.stdout
        want = ["/home/lab/ddplab/venv/bin/python", "2.13.0+cpu", "lab", "lab", "lab", "0", "700"]
        assert lines[3:] == want, got.stdout
        # nothing went into the system Python
        assert as_lab(c, host, "python3 -c 'import torch'").returncode != 0


def test_inactive_ufw_stays_off_with_the_peer_rule_and_the_limit_rule_kept(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    assert not ufw_active(c, "node0")
    rules = peer_rules(addr["node1"], addr["node0"], ephemeral_ports(c, "node0"))
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp", *rules]
    assert "ufw is inactive, so it blocks nothing" in prepared[0].stdout
    assert "node1: neither ufw nor firewalld is installed" in prepared[0].stdout


# A host on the LAN that is no node (simlan.outsider) knocks on the master port for up to `seconds`: it prints
# "connected" as soon as a connection is accepted, else how the last attempt failed.
KNOCK = """
import socket, sys, time
addr, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline, last = time.monotonic() + seconds, "no attempt"
while time.monotonic() < deadline:
    try:
        socket.create_connection((addr, port), timeout=3).close()
        print("connected"); sys.exit(0)
    except OSError as e:
        last = f"{type(e).__name__}: {e}"
    time.sleep(0.5)
print(last)
"""


def knock(c, addr: str, seconds: float) -> str:
    """What a host outside the lab gets from the master port (node0's address), as it would try."""
    with outsider(c, programs_of="node1") as argv:
        got = subprocess.run(argv + ["python3", "-c", KNOCK, addr, "29500", str(seconds)],
                             capture_output=True, text=True, timeout=seconds + 60)
    return got.stdout.strip() + got.stderr[-500:]


def test_a_default_launch_is_refused_where_the_lan_could_reach_the_master_port(stock, prepared):
    """Closed by default (attack: a LAN host outside the inventory connects to the master port of a default
    run). node0's ufw is installed and off (a stock Ubuntu), node1 has none (a stock Debian): the old code
    started the run and the outsider's connection to the store was accepted. Now launch refuses, naming each
    node and both fixes, and nothing listens for the outsider to reach."""
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    extra = {**stock["extra"], "ddplab_trainer_steps": 100000, "ddplab_run_id": "stock-open"}
    try:
        run = playbook("launch.yml", inventory=stock["inv"], extra=extra, timeout=600)
        got = knock(c, addr["node0"], 15)
        assert got != "connected", "a host outside the lab connected to the master port of a default run"
        assert run.returncode != 0, tail(run)
        for line in ("FAIL node0 firewall: ufw is off on node0: the master port 29500 and gloo's ports would "
                     "be open to every host of the network during a run",
                     "FAIL node1 firewall: no firewall (ufw, firewalld) is installed on node1: gloo's ports"):
            assert line in run.stdout, tail(run)
        assert run.stdout.count("-e firewall_enable=true") >= 2 and "ddplab_open_to_lan: true" in run.stdout
        assert torchrun_pids(c, "node0", "stock-open") == []
    finally:  # the old code's run would hold the master port for the tests after
        if any(run_pids(c, h, "stock-open") for h in ("node0", "node1")):
            playbook("stop.yml", inventory=stock["inv"], timeout=300,
                     extra={**stock["extra"], "ddplab_run_id": "stock-open"})


def test_launch_with_firewall_enable_trains_across_both_stock_hosts(stock, prepared):
    """The first fix the refusal names, given at launch: ufw turned on at node0, installed and turned on at
    node1 (SSH stays allowed); the healthy lab then trains."""
    assert prepared[0].returncode == 0, tail(prepared[0])
    extra = {**stock["extra"], "ddplab_wait": "true", "ddplab_trainer_steps": 3, "ddplab_run_id": "stock-a",
             "firewall_enable": "true"}
    t0 = time.monotonic()
    run = playbook("launch.yml", inventory=stock["inv"], extra=extra, timeout=900)
    print(f"\nstock hosts: launch.yml on prepared hosts (turning the firewall on), 3 steps, to the collected "
          f"report: {time.monotonic() - t0:.0f} s")
    assert run.returncode == 0, tail(run, 120)
    assert all(ufw_active(stock["cluster"], h) for h in ("node0", "node1"))
    summary = json.loads((stock["extra"]["ddplab_runs_dir"] / "stock-a" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["byte_equivalent"] is True
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    for host in ("node0", "node1"):
        mode = as_lab(stock["cluster"], host, "stat -c '%a %U' ~/ddplab/runs/stock-a/trainer.env")
        assert mode.stdout.split() == ["600", "lab"], mode.stderr


def test_a_lan_host_outside_the_lab_cannot_reach_the_master_port_of_a_run(stock, prepared):
    """The firewall on, a run going: the master port lets its peer in and drops the host outside the
    inventory."""
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    extra = {**stock["extra"], "ddplab_trainer_steps": 100000, "ddplab_run_id": "stock-closed"}
    try:
        run = playbook("launch.yml", inventory=stock["inv"], extra=extra, timeout=600)
        assert run.returncode == 0, tail(run)
        deadline = time.monotonic() + 300  # torchrun's start on a machine shared with others
        while ":29500" not in c.exec("node0", ["ss", "-Htln"], timeout=30).stdout:
            assert time.monotonic() < deadline, "the run's store did not listen on the master port"
            time.sleep(2)
        # the same knock from the peer (a node of the lab) is let in: the port is open to the lab
        peer = as_lab(c, "node1", f"python3 -c {shlex.quote(KNOCK)} {addr['node0']} 29500 30")
        assert peer.stdout.strip() == "connected", peer.stdout + peer.stderr
        got = knock(c, addr["node0"], 8)
        assert got.startswith("TimeoutError"), got  # ufw's default for everyone else: deny (dropped)
        assert ":29500" in c.exec("node0", ["ss", "-Htln"], timeout=30).stdout, "the run ended first"
    finally:
        playbook("stop.yml", inventory=stock["inv"], timeout=300,
                 extra={**stock["extra"], "ddplab_run_id": "stock-closed"})


def test_firewall_enable_turns_ufw_on_and_adds_no_ssh_rule(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    on = playbook("prepare.yml", "--tags", "firewall", inventory=stock["inv"],
                  extra={**stock["extra"], "firewall_enable": "true"}, timeout=300)
    assert on.returncode == 0, tail(on)
    assert ufw_active(c, "node0")
    # the user's `limit 22/tcp` already lets SSH in: it stays, and nothing wider appears
    rules = peer_rules(addr["node1"], addr["node0"], ephemeral_ports(c, "node0"))
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp", *rules]
    assert as_lab(c, "node0", "true").returncode == 0  # still reachable over SSH


def test_cleanup_removes_exactly_this_labs_rules_and_turns_ufw_back_off(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    assert ufw_active(c, "node0")  # turned on by firewall_enable above
    # another lab on the same node (its master elsewhere): its rule is not this lab's to remove
    other = "ufw allow from 10.99.0.5 to any port 29600 proto tcp comment 'ddplab-lab-10.99.0.1'"
    c.exec("node0", ["sh", "-c", f"{other} >/dev/null"], timeout=60, check=True)
    clean = playbook("stop.yml", "--tags", "firewall_cleanup", inventory=stock["inv"], extra=stock["extra"],
                     timeout=300)
    assert clean.returncode == 0, tail(clean)
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp", other]
    assert not ufw_active(c, "node0")  # this lab turned it on: back off, as the user had it
    c.exec("node0", ["sh", "-c", f"ufw delete {other.removeprefix('ufw ')} >/dev/null"], timeout=60,
           check=True)


def test_cleanup_never_locks_the_user_out(stock, prepared):
    """No SSH rule of the user's: ddplab's enable adds one from the control host; the cleanup must not
    leave ufw on without it."""
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    c.exec("node0", ["sh", "-c", "ufw delete limit 22/tcp >/dev/null"], timeout=60, check=True)
    try:
        on = playbook("prepare.yml", "--tags", "firewall", inventory=stock["inv"],
                      extra={**stock["extra"], "firewall_enable": "true"}, timeout=300)
        assert on.returncode == 0, tail(on)
        assert ufw_active(c, "node0")
        assert any("to any port 22 proto tcp" in r for r in ufw_added(c, "node0"))
        clean = playbook("stop.yml", "--tags", "firewall_cleanup", inventory=stock["inv"],
                         extra=stock["extra"], timeout=300)
        assert clean.returncode == 0, tail(clean)
        assert as_lab(c, "node0", "true").returncode == 0, "SSH no longer connects after the cleanup"
        assert not ufw_active(c, "node0") and ufw_added(c, "node0") == []
        # ufw on by the user's hand, with only ddplab's SSH rule: the cleanup keeps that rule and says so
        on = playbook("prepare.yml", "--tags", "firewall", inventory=stock["inv"],
                      extra={**stock["extra"], "firewall_enable": "true"}, timeout=300)
        assert on.returncode == 0, tail(on)
        record = f"/var/lib/ddplab/firewall-{lab_comment(stock['addr']['node0'])}-node0.json"
        c.exec("node0", ["rm", record], timeout=30, check=True)  # as if the user had turned ufw on themselves
        clean = playbook("stop.yml", "--tags", "firewall_cleanup", inventory=stock["inv"],
                         extra=stock["extra"], timeout=300)
        assert clean.returncode == 0, tail(clean)
        assert "would lock you out" in clean.stdout, tail(clean)
        assert ufw_active(c, "node0")
        assert as_lab(c, "node0", "true").returncode == 0, "SSH no longer connects after the cleanup"
    finally:
        # The later tests start from the stock state (ufw inactive, the user's `limit 22/tcp`)
        c.exec("node0", ["sh", "-c", "ufw --force disable >/dev/null; ufw --force reset >/dev/null; "
                         "ufw limit 22/tcp >/dev/null"], timeout=60, check=True)


# ---------------------------------------------------------------- sudo's password: prompt and vault
def inventory_without_become_password(stock, dest: Path) -> tuple[Path, str]:
    """A copy of the stock inventory with no ansible_become_password: (its folder, the password)."""
    shutil.copytree(stock["inv"], dest)
    gv = dest / "group_vars" / "all" / "simlan.yml"
    data = yaml.safe_load(gv.read_text())
    password = data.pop("ansible_become_password")
    gv.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest, password


def playbook_on_a_tty(argv: list[str], answer: str, timeout: float = 300) -> tuple[int, str, int]:
    """ansible-playbook on a pseudo-terminal, typing `answer` at its BECOME password prompt:
    (exit code, output, how many prompts were answered)."""
    env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty, as a user's shell
        os.chdir(REPO)
        os.execve(argv[0], argv, env)
    out, answered, deadline = b"", 0, time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 1)
            if not ready:
                continue
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
            if out.count(b"BECOME password:") > answered:
                os.write(fd, answer.encode() + b"\n")
                answered += 1
        else:
            os.kill(pid, 9)
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace"), answered


def test_ask_become_pass_typed_on_a_terminal(stock, prepared, tmp_path):
    assert prepared[0].returncode == 0, tail(prepared[0])
    inv, password = inventory_without_become_password(stock, tmp_path / "inv")
    # --tags firewall: the lab folders and ufw on node0, whose tasks become root (ufw refuses anyone else)
    argv = [str(BIN / "ansible-playbook"), "playbooks/prepare.yml", "-i", str(inv), "--tags", "firewall",
            "--ask-become-pass", *(a for k, v in stock["extra"].items() for a in ("-e", f"{k}={v}"))]
    rc, out, answered = playbook_on_a_tty(argv, password)
    assert answered == 1 and "BECOME password:" in out
    assert rc == 0, out[-4000:]
    assert re.search(r"node0\s+: ok=\d+\s+changed=\d+\s+unreachable=0\s+failed=0", out), out[-4000:]
    rc, out, answered = playbook_on_a_tty(argv, password + "-wrong")
    assert answered == 1 and rc != 0, out[-4000:]
    assert re.search(r"fatal: \[node0\]: FAILED! => .*Incorrect sudo password", out), out[-4000:]


def test_vaulted_become_password_in_the_inventory(stock, prepared, tmp_path):
    assert prepared[0].returncode == 0, tail(prepared[0])
    inv, password = inventory_without_become_password(stock, tmp_path / "inv")
    vault_pass = tmp_path / "vault-pass"
    vault_pass.write_text("rehearsal vault passphrase\n")
    vaulted = subprocess.run([str(BIN / "ansible-vault"), "encrypt_string", "--vault-password-file",
                              str(vault_pass), "--name", "ansible_become_password",
                              "--", password],  # `--`: a random password may start with "-"
                             capture_output=True, text=True, timeout=60, check=True, cwd=REPO).stdout
    assert "!vault |" in vaulted and password not in vaulted
    (inv / "group_vars" / "all" / "become.yml").write_text(vaulted)
    run = playbook("prepare.yml", "--tags", "firewall", "--vault-password-file", str(vault_pass),
                   inventory=inv, extra=stock["extra"], timeout=300)
    assert run.returncode == 0, tail(run)
    assert recap(run)["node0"]["failed"] == 0


# ---------------------------------------------------------------- processes: whose may be signalled
def run_pids(c, host: str, run_id: str) -> list[str]:
    """PIDs on `host` of run `run_id` (DDPLAB_RUN_ID in their environment), read as `lab`."""
    code = ("import os\n"
            "for p in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try: env = open(f'/proc/{p}/environ','rb').read()\n"
            "    except OSError: continue\n"
            f"    if b'DDPLAB_RUN_ID={run_id}\\0' in env: print(p)\n")
    got = as_lab(c, host, f"python3 -c {shlex.quote(code)}")
    assert got.returncode == 0, got.stderr
    return sorted(got.stdout.split(), key=int)


def torchrun_pids(c, host: str, run_id: str) -> list[str]:
    return [p for p in run_pids(c, host, run_id)
            if "torch.distributed.run" in as_lab(c, host, f"tr '\\0' ' ' < /proc/{p}/cmdline").stdout]


def test_a_live_run_survives_prepare_unless_replace_is_asked(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    start = playbook("start.yml", inventory=stock["inv"], timeout=300,
                     extra={**stock["extra"], "ddplab_trainer_steps": 100000, "ddplab_run_id": "stock-live"})
    assert start.returncode == 0, tail(start)
    try:
        deadline = time.monotonic() + 60
        while not all(torchrun_pids(c, h, "stock-live") for h in ("node0", "node1")):
            assert time.monotonic() < deadline, "the run's torchrun did not start"
            time.sleep(1)
        before = {h: run_pids(c, h, "stock-live") for h in ("node0", "node1")}

        refused = playbook("prepare.yml", inventory=stock["inv"], extra=stock["extra"], timeout=600)
        assert refused.returncode != 0, tail(refused)
        for host in ("node0", "node1"):
            assert f"ddplab: error: {host}: run stock-live is still running there (torchrun PID " \
                in refused.stdout, tail(refused)
            assert set(before[host]) <= set(run_pids(c, host, "stock-live")), \
                f"prepare ended a rank on {host}"
        assert "playbooks/stop.yml -e ddplab_run_id=stock-live" in refused.stdout
        assert "-e ddplab_replace_running=true" in refused.stdout

        replaced = playbook("prepare.yml", inventory=stock["inv"], timeout=600,
                            extra={**stock["extra"], "ddplab_replace_running": "true"})
        assert replaced.returncode == 0, tail(replaced)
        assert "live run stock-live, replaced: ddplab_replace_running=true" in replaced.stdout
        for host in ("node0", "node1"):
            assert run_pids(c, host, "stock-live") == [], host
    finally:  # a run left going would hold the master port for the tests after (and test_slurm.py)
        if any(run_pids(c, h, "stock-live") for h in ("node0", "node1")):
            playbook("stop.yml", inventory=stock["inv"], timeout=300,
                     extra={**stock["extra"], "ddplab_run_id": "stock-live"})


def test_root_listener_on_the_master_port_is_named_not_killed(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    # SO_REUSEADDR: the live-run test's master left connections in TIME_WAIT on this port
    listener = ("import socket,time; s=socket.socket(); "
                "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
                "s.bind(('0.0.0.0',29500)); s.listen(); time.sleep(3600)")
    squatter = c.exec("node0", ["sh", "-c", f"setsid python3 -c \"{listener}\" >/dev/null 2>&1 </dev/null "
                                "& echo $!"], timeout=30, check=True).stdout.strip()
    try:
        deadline = time.monotonic() + 10
        while ":29500" not in c.exec("node0", ["ss", "-Htln"], timeout=30).stdout:
            assert time.monotonic() < deadline, "the listener did not start"
            time.sleep(0.2)
        # a module planted in the login user's home, where the root scan used to start: never run as root
        planted = "import os\nopen('/tmp/json-ran-as-uid-%d' % os.getuid(), 'w').close()\n"
        c.exec("node0", ["su", "lab", "-c", f"printf %s {shlex.quote(planted)} > ~/json.py"], timeout=30,
               check=True)
        run = playbook("prepare.yml", inventory=stock["inv"], extra=stock["extra"], timeout=600)
        assert run.returncode != 0, tail(run)
        assert c.exec("node0", ["test", "-e", "/tmp/json-ran-as-uid-0"], timeout=30).returncode != 0, \
            "the root scan imported ~/json.py"
        # `lab` cannot see root's PID; the read-only root scan names it, as the user would need it
        assert (f"ddplab: error: node0: master port 29500 is held by PID {squatter} of user root: "
                "python3 -c import socket") in run.stdout, tail(run)
        assert "never another user's process" in run.stdout
        assert c.exec("node0", ["kill", "-0", squatter], timeout=30).returncode == 0, "prepare killed it"
    finally:
        c.exec("node0", ["kill", squatter], timeout=30)
        c.exec("node0", ["rm", "-f", "/home/lab/json.py"], timeout=30)
