"""ddplab on stock machines (issue 12): two `simlan up --stock` hosts (Debian 12 minimal, login `lab` with a
sudo password, no tmux/venv/torch/ufw, the stock 127.0.1.1 line, PyPI out of reach) taken from bare to a
trained run by the README's commands, as `lab`, with become only where root is needed.

One cluster serves the module, in order: prepare twice (changed>0, then 0), launch, firewall turned on,
firewall cleanup. node0 starts with ufw installed, inactive, holding the user's own `limit 22/tcp`.
The times of the first and second prepare are printed (`pytest -s`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from simlan import cluster as simlan
from simlan.system import missing_requirements, which
from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

WHEELHOUSE = REPO / "wheelhouse"  # ddplab_wheelhouse_dir's default: what `make wheelhouse` fills
PEER_RULE = "ufw allow from {addr} proto tcp comment 'ddplab'"


def _skip_reason() -> str | None:
    problem = missing_requirements()
    if problem:
        return f"simlan: {problem}"
    for tool, pkg in (("debootstrap", "debootstrap"), ("iptables", "iptables"), ("ssh", "openssh-client")):
        if which(tool) is None:
            return f"simlan --stock: missing `{tool}` (apt-get install -y {pkg})"
    return None


@pytest.fixture(scope="module")
def stock(tmp_path_factory):
    """Two bare stock hosts, a wheelhouse and a small shard set; the hosts are taken down at the end."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    if not (WHEELHOUSE / "manifest.json").exists():  # `make wheelhouse` without its `setup` prerequisite
        subprocess.run([sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(WHEELHOUSE),
                        "--python", "3.11"], cwd=REPO, check=True, timeout=900)
    c = simlan.up(2, stock=True, force=True, timeout=20)
    # The user's own firewall on node0: ufw installed, inactive, with a rate-limited SSH rule.
    c.exec("node0", ["sh", "-c", "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                     "--no-install-recommends ufw >/dev/null && ufw limit 22/tcp >/dev/null"],
           timeout=300, check=True)
    extra = {"ddplab_data_dir": make_shards(tmp_path_factory.getbasetemp() / "shards"),
             "ddplab_runs_dir": tmp_path_factory.mktemp("stock-runs"), "ddplab_threads": 1,
             "ddplab_wait_poll": 2}
    yield {"cluster": c, "inv": c.inventory_dir, "extra": extra,
           "addr": {h.name: h.addr for h in c.hosts}, "first": {}}
    current = simlan.load()
    if current is not None and current.stock:
        simlan.down()


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
                     "find ~/ddplab ! -user lab | wc -l")
        assert got.returncode == 0, got.stderr
        lines = got.stdout.split()
        assert lines[:3] == ["/usr/bin/tmux", "/usr/bin/rsync", "/usr/bin/ss"], got.stdout
        want = ["/home/lab/ddplab/venv/bin/python", "2.13.0+cpu", "lab", "lab", "lab", "0"]
        assert lines[3:] == want, got.stdout
        # nothing went into the system Python
        assert as_lab(c, host, "python3 -c 'import torch'").returncode != 0


def test_inactive_ufw_stays_off_with_the_peer_rule_and_the_limit_rule_kept(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    assert not ufw_active(c, "node0")
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp", PEER_RULE.format(addr=addr["node1"])]
    assert "ufw is inactive, so it blocks nothing" in prepared[0].stdout
    assert "node1: neither ufw nor firewalld is installed" in prepared[0].stdout


def test_launch_trains_across_both_stock_hosts(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    extra = {**stock["extra"], "ddplab_wait": "true", "ddplab_trainer_steps": 3, "ddplab_run_id": "stock-a"}
    t0 = time.monotonic()
    run = playbook("launch.yml", inventory=stock["inv"], extra=extra, timeout=600)
    print(f"\nstock hosts: launch.yml on prepared hosts, 3 steps, to the collected report: "
          f"{time.monotonic() - t0:.0f} s")
    assert run.returncode == 0, tail(run, 120)
    summary = json.loads((stock["extra"]["ddplab_runs_dir"] / "stock-a" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["byte_equivalent"] is True
    assert summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    for host in ("node0", "node1"):
        mode = as_lab(stock["cluster"], host, "stat -c '%a %U' ~/ddplab/runs/stock-a/trainer.env")
        assert mode.stdout.split() == ["600", "lab"], mode.stderr


def test_firewall_enable_turns_ufw_on_and_adds_no_ssh_rule(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c, addr = stock["cluster"], stock["addr"]
    on = playbook("prepare.yml", "--tags", "firewall", inventory=stock["inv"],
                  extra={**stock["extra"], "firewall_enable": "true"}, timeout=300)
    assert on.returncode == 0, tail(on)
    assert ufw_active(c, "node0")
    # the user's `limit 22/tcp` already lets SSH in: it stays, and nothing wider appears
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp", PEER_RULE.format(addr=addr["node1"])]
    assert as_lab(c, "node0", "true").returncode == 0  # still reachable over SSH


def test_cleanup_removes_exactly_ddplabs_rules(stock, prepared):
    assert prepared[0].returncode == 0, tail(prepared[0])
    c = stock["cluster"]
    was_active = ufw_active(c, "node0")
    clean = playbook("stop.yml", "--tags", "firewall_cleanup", inventory=stock["inv"], extra=stock["extra"],
                     timeout=300)
    assert clean.returncode == 0, tail(clean)
    assert ufw_added(c, "node0") == ["ufw limit 22/tcp"]
    assert ufw_active(c, "node0") == was_active  # on/off state untouched
