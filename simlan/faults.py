"""Failures on purpose: a host that dies (`kill_host`), one that freezes and thaws, as a laptop whose lid
closes and opens (`freeze_host`, `thaw_host`: simlan.freezer), and an sshd that stops, starts or drops its
connections (`sshd`)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

from simlan import freezer, network, wifi
from simlan.defaults import READY_TIMEOUT, SSHD
from simlan.errors import SimlanError
from simlan.hosts import Cluster
from simlan.probe import comm, ssh_answers
from simlan.state import locked
from simlan.system import kill_recorded, processes_in_pid_namespace, require, start_time, wait_gone


def kill_host(cluster: Cluster, name: str, *, keep_link: bool = False) -> None:
    """Simulate a host dying: pull its cable (unless keep_link), then SIGKILL its PID 1, which
    ends every process of the host. Peers see silence, as with a machine that lost power."""
    tools = require()
    with locked(cluster.state_dir):
        h = cluster.host(name)
        if not keep_link:
            network.set_link(tools["ip"], name, up=False)
        kill_recorded(h.pid1, h.pid1_start)
        wait_gone(h.pid1, h.pid1_start)
        wait_gone(h.unshare_pid, h.unshare_start)
        h.killed = True
        cluster.save()


def revive_host(cluster: Cluster, name: str, timeout: float = READY_TIMEOUT) -> None:
    """Bring a host killed by kill_host back, as a machine switched on again: a new PID 1 and sshd on the
    same files and address, cable plugged in. Its processes of before are gone for good."""
    from simlan import lifecycle

    tools = require()
    with locked(cluster.state_dir):
        h = cluster.host(name)
        if h.alive:
            raise SimlanError(f"{name} is up (its PID 1 runs); revive-host brings back a killed host")
        network.set_link(tools["ip"], name, up=True)
        lifecycle._start_host(cluster, h, tools)
        h.killed = False
        cluster.save()
    deadline = time.monotonic() + timeout
    while not ssh_answers(h.addr, timeout=0.2):
        if time.monotonic() > deadline:
            raise SimlanError(f"{name}: sshd did not answer on {h.addr}:22 within {timeout:g} s after the "
                              "revive")
        time.sleep(0.05)


def freeze_host(cluster: Cluster, name: str) -> None:
    """Stop every process of the host where it is (PID 1 and everything in its PID namespace)."""
    with locked(cluster.state_dir):
        h = cluster.host(name)
        if not h.alive:
            raise SimlanError(f"{name} is down (its PID 1 is gone); nothing to freeze")
        h.freezer = freezer.freeze(name, lambda: processes_in_pid_namespace(h.pid1))
        cluster.save()


def set_link(cluster: Cluster, name: str, delay: str, jitter: str, loss: str) -> None:
    """Give the host's outgoing packets a delay, jitter and loss (simlan.wifi), replacing the link it had;
    all zero leaves a plain link."""
    values = wifi.parse_time(delay, "delay"), wifi.parse_time(jitter, "jitter"), wifi.parse_loss(loss)
    with locked(cluster.state_dir):
        h = cluster.host(name)
        if not h.alive:
            raise SimlanError(f"{name} is down (its PID 1 is gone); nothing to shape")
        ns = network.netns_name(name)
        if h.link:
            wifi.stop(ns, h.link.get("pid"), h.link.get("start"))
            h.link = None
        if any(values):
            pid = wifi.start(ns, *values)
            h.link = {"delay": delay, "jitter": jitter, "loss": loss, "pid": pid, "start": start_time(pid)}
        cluster.save()


def thaw_host(cluster: Cluster, name: str) -> None:
    """Let the host's frozen processes run on; a host never frozen is left as it is."""
    with locked(cluster.state_dir):
        h = cluster.host(name)
        if not h.freezer:
            raise SimlanError(f"{name} was not frozen; `simlan freeze {name}` freezes it", code=2)
        freezer.thaw(h.freezer)


def sshd(cluster: Cluster, name: str, action: str, *, cut: bool = False,
         timeout: float = READY_TIMEOUT) -> str:
    """Stop, start or restart the host's sshd. `cut` (stop/restart) also kills every running
    SSH session of the host, as a dropped connection would. Returns what was done."""
    h = cluster.host(name)
    if not h.alive:
        raise SimlanError(f"{name} is down (its PID 1 is gone); nothing to do with its sshd")
    done = []
    if action in ("stop", "restart"):
        listeners = cluster.sshd_listeners(name)
        for pid in listeners:
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while cluster.sshd_listeners(name) and time.monotonic() < deadline:
            time.sleep(0.02)
        done.append(f"stopped sshd (pid {', '.join(map(str, listeners))})" if listeners
                    else "sshd was not running")
        if cut:
            sessions = [p for p in processes_in_pid_namespace(h.pid1) if comm(p) == "sshd"]
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            done.append(f"cut {len(sessions)} ssh session process(es)")
    if action in ("start", "restart"):
        if cluster.sshd_listeners(name):
            done.append("sshd already running")
        else:
            cfg, log = cluster.sshd_config(name), cluster.sshd_log(name, inside=True)
            cluster.exec(name, ["bash", "-c", f"setsid {SSHD} -D -e -f {cfg} >>{log} 2>&1 </dev/null &"],
                         timeout=10, check=True)
            deadline = time.monotonic() + timeout
            while not ssh_answers(h.addr):
                if time.monotonic() > deadline:
                    raise SimlanError(f"{name}: sshd did not answer on {h.addr}:22 within "
                                      f"{timeout:g} s; see {cluster.sshd_log(name)}")
                time.sleep(0.05)
            done.append(f"started sshd (pid {', '.join(map(str, cluster.sshd_listeners(name)))})")
    if not done:
        raise SimlanError(f"unknown sshd action {action!r}; use stop, start or restart", code=2)
    return "; ".join(done)

