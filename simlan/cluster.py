"""A simlan cluster: create it (`up`), find it again (`load`), use it (`Cluster.exec`, `.status`,
`.kill_host`, `.sshd`) and remove it (`down`). Every name and PID it creates is recorded in
`<state>/cluster.json` before or as it is created, so `down` (and a failed `up`) removes exactly
what simlan made and nothing else."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simlan import inventory, network
from simlan.errors import SimlanError
from simlan.hostinit import write_host_files
from simlan.state import load as load_state
from simlan.state import locked, save, state_dir
from simlan.system import (
    SYSTEM_PATH,
    children,
    cmdline,
    is_alive,
    kill_recorded,
    processes_in_pid_namespace,
    require,
    run,
    start_time,
    wait_gone,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO_ROOT / "inventory" / ("simlan" if network.LAB == 0 else f"simlan{network.LAB}")
DEFAULT_SYN_RETRIES = 3  # kernel default 6 (~127 s before connect() gives up); 3 gives ~15 s
READY_TIMEOUT = 10.0
SSHD = "/usr/sbin/sshd"


@dataclass
class Host:
    name: str
    addr: str
    dir: str
    cpu: int | None = None
    unshare_pid: int | None = None
    unshare_start: int | None = None
    pid1: int | None = None
    pid1_start: int | None = None
    killed: bool = False

    @property
    def alive(self) -> bool:
        return is_alive(self.pid1, self.pid1_start)


@dataclass
class Cluster:
    state_dir: Path
    hosts: list[Host]
    inventory_dir: Path
    python: str
    rate: str | None = None
    cpus: str = "none"
    syn_retries: int = DEFAULT_SYN_RETRIES
    real_home: str = "/root"
    created_by: int = 0
    created_at: float = 0.0
    inventory_written: bool = False
    reused: bool = field(default=False, compare=False)  # `up` found it already running

    # ---- persistence ----
    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("reused")
        data["state_dir"] = str(self.state_dir)
        data["inventory_dir"] = str(self.inventory_dir)
        data["version"] = 1
        return data

    @classmethod
    def from_json(cls, data: dict) -> Cluster:
        data = dict(data)
        data.pop("version", None)
        hosts = [Host(**h) for h in data.pop("hosts")]
        return cls(hosts=hosts, **{**data, "state_dir": Path(data["state_dir"]),
                                   "inventory_dir": Path(data["inventory_dir"])})

    def save(self) -> None:
        save(self.state_dir, self.to_json())

    # ---- lookups ----
    @property
    def key(self) -> Path:
        """The client private key (also copied to the inventory folder)."""
        return self.state_dir / "id_ed25519"

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise SimlanError(f"no host {name!r} in this cluster (hosts: "
                          f"{', '.join(h.name for h in self.hosts)})", code=2)

    def host_env(self, name: str) -> dict[str, str]:
        """The environment of a login on the host (what `exec` runs with)."""
        return {
            "PATH": SYSTEM_PATH, "HOME": self.real_home, "USER": "root", "LOGNAME": "root",
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "SIMLAN_HOST": name, "HOSTNAME": name,
            "TERM": os.environ.get("TERM", "dumb"),
        }

    def pin(self, name: str):
        """A preexec_fn that gives a process started from outside the host the host's CPU
        placement (processes started inside inherit it from PID 1), or None when unpinned."""
        cpu = self.host(name).cpu
        if cpu is None:
            return None
        return lambda: os.sched_setaffinity(0, {cpu})

    def nsenter_argv(self, name: str) -> list[str]:
        h = self.host(name)
        if not h.alive:
            raise SimlanError(f"{name} is down (its PID 1 is gone); recreate the cluster: "
                              "python -m simlan up --force --nodes N")
        return ["nsenter", "-t", str(h.pid1), "-n", "-m", "-p", "-u", f"--wdns={self.real_home}", "--"]

    # ---- running things on a host ----
    def exec(self, name: str, cmd: list[str], *, timeout: float | None = 60, input: str | None = None,
             check: bool = False, capture: bool = True) -> subprocess.CompletedProcess:
        """Run `cmd` inside host `name` (its network, mount, PID and UTS namespaces)."""
        proc = subprocess.run(self.nsenter_argv(name) + list(cmd), input=input, text=True,
                              capture_output=capture, timeout=timeout, env=self.host_env(name),
                              stdin=None if input is not None else subprocess.DEVNULL,
                              preexec_fn=self.pin(name))
        if check and proc.returncode != 0:
            raise SimlanError(f"{name}: {' '.join(cmd)} exited {proc.returncode}: "
                              f"{(proc.stderr or '').strip()[-500:]}")
        return proc

    def popen(self, name: str, cmd: list[str], **kwargs) -> subprocess.Popen:
        """Start `cmd` inside host `name` without waiting (e.g. a listener)."""
        return subprocess.Popen(self.nsenter_argv(name) + list(cmd), env=self.host_env(name),
                                preexec_fn=self.pin(name), **kwargs)

    def ssh_argv(self, name: str, *cmd: str) -> list[str]:
        """An OpenSSH client command line that logs into host `name` as root with the cluster key."""
        return ["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                f"root@{self.host(name).addr}", *cmd]

    # ---- health ----
    def sshd_listeners(self, name: str) -> list[int]:
        """Global PIDs of the host's listening sshd (`sshd -D -e -f <cfg>`); sessions excluded."""
        h = self.host(name)
        if not h.alive:
            return []
        # sshd rewrites its command line: "sshd: /usr/sbin/sshd -D -e -f CFG [listener] ...".
        mine = f"{SSHD} -D -e -f {Path(h.dir) / 'sshd_config'}"
        return [p for p in processes_in_pid_namespace(h.pid1)
                if _comm(p) == "sshd" and mine in " ".join(cmdline(p))]

    def status(self) -> list[dict]:
        """One row per host: name, addr, pid1 (None when dead), sshd state, rate, cpu, ok."""
        rows = []
        for h in self.hosts:
            alive = h.alive
            if not alive:
                sshd = "dead"
            elif ssh_answers(h.addr):
                sshd = "up"
            elif self.sshd_listeners(h.name):
                sshd = "not answering"
            else:
                sshd = "stopped"
            cpu = "-"
            try:
                allowed = sorted(os.sched_getaffinity(h.pid1)) if alive else []
            except OSError:  # it died just now
                alive, sshd, allowed = False, "dead", []
            if alive:
                cpu = "any" if allowed == sorted(os.sched_getaffinity(0)) and h.cpu is None \
                    else ",".join(map(str, allowed))
            rows.append({"host": h.name, "address": h.addr, "pid1": h.pid1 if alive else None,
                         "sshd": sshd, "rate": self.rate or "-", "cpu": cpu,
                         "ok": alive and sshd == "up"})
        return rows

    def healthy(self) -> bool:
        return all(r["ok"] for r in self.status())

    # ---- failures on purpose ----
    def kill_host(self, name: str, *, keep_link: bool = False) -> None:
        """Simulate a host dying: pull its cable (unless keep_link), then SIGKILL its PID 1, which
        ends every process of the host. Peers see silence, as with a machine that lost power."""
        tools = require()
        with locked(self.state_dir):
            h = self.host(name)
            if not keep_link:
                network.set_link(tools["ip"], name, up=False)
            kill_recorded(h.pid1, h.pid1_start)
            wait_gone(h.pid1, h.pid1_start)
            wait_gone(h.unshare_pid, h.unshare_start)
            h.killed = True
            self.save()

    def sshd(self, name: str, action: str, *, cut: bool = False, timeout: float = READY_TIMEOUT) -> str:
        """Stop, start or restart the host's sshd. `cut` (stop/restart) also kills every running
        SSH session of the host, as a dropped connection would. Returns what was done."""
        h = self.host(name)
        if not h.alive:
            raise SimlanError(f"{name} is down (its PID 1 is gone); nothing to do with its sshd")
        done = []
        if action in ("stop", "restart"):
            listeners = self.sshd_listeners(name)
            for pid in listeners:
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while self.sshd_listeners(name) and time.monotonic() < deadline:
                time.sleep(0.02)
            done.append(f"stopped sshd (pid {', '.join(map(str, listeners))})" if listeners
                        else "sshd was not running")
            if cut:
                sessions = [p for p in processes_in_pid_namespace(h.pid1) if _comm(p) == "sshd"]
                for pid in sessions:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                done.append(f"cut {len(sessions)} ssh session process(es)")
        if action in ("start", "restart"):
            if self.sshd_listeners(name):
                done.append("sshd already running")
            else:
                cfg, log = Path(h.dir) / "sshd_config", Path(h.dir) / "sshd.log"
                self.exec(name, ["bash", "-c", f"setsid {SSHD} -D -e -f {cfg} >>{log} 2>&1 </dev/null &"],
                          timeout=10, check=True)
                deadline = time.monotonic() + timeout
                while not ssh_answers(h.addr):
                    if time.monotonic() > deadline:
                        raise SimlanError(f"{name}: sshd did not answer on {h.addr}:22 within "
                                          f"{timeout:g} s; see {log}")
                    time.sleep(0.05)
                done.append(f"started sshd (pid {', '.join(map(str, self.sshd_listeners(name)))})")
        if not done:
            raise SimlanError(f"unknown sshd action {action!r}; use stop, start or restart", code=2)
        return "; ".join(done)

    def down(self) -> None:
        down(self.state_dir)


# ---- module-level API ----

def load(state: str | os.PathLike | None = None) -> Cluster | None:
    """The recorded cluster, or None."""
    data = load_state(state_dir(state))
    return Cluster.from_json(data) if data else None


def venv_python() -> str:
    """The Python running simlan, as its venv path (.venv/bin/python), not the interpreter it links to."""
    if sys.prefix != sys.base_prefix:
        for name in ("python", "python3"):
            candidate = Path(sys.prefix, "bin", name)
            if candidate.exists():
                return str(candidate)
    return sys.executable


def keep_paths(real_home: str, python: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Top-level entries of the real home (or of /tmp, which is private too: a checkout in /tmp) that
    must stay visible in the host: those holding the Python installs in use (e.g. /root/.pyenv), the
    repository, and `extra`."""
    return _tops(real_home, python, extra)


def keep_tmp_paths(python: str, extra: tuple[str, ...] = ()) -> list[str]:
    return _tops("/tmp", python, extra)


def _tops(root: str, python: str, extra: tuple[str, ...]) -> list[str]:
    home = Path(root).resolve()
    candidates = [sys.base_prefix, sys.prefix, sys.executable, python, os.path.realpath(python),
                  str(REPO_ROOT), *extra]
    keep: list[str] = []
    for cand in candidates:
        real = Path(os.path.realpath(cand))
        try:
            rel = real.relative_to(home)
        except ValueError:
            continue  # outside the home: visible anyway
        if rel.parts and str(home / rel.parts[0]) not in keep:
            keep.append(str(home / rel.parts[0]))
    return keep


def ssh_answers(addr: str, timeout: float = 0.5) -> bool:
    """True when an SSH server greets us on addr:22."""
    try:
        with socket.create_connection((addr, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


def up(nodes: int, *, rate: str | None = None, cpus: str = "none",
       syn_retries: int = DEFAULT_SYN_RETRIES, force: bool = False,
       inventory_dir: str | os.PathLike | None = None, python: str | None = None,
       keep: tuple[str, ...] = (), state: str | os.PathLike | None = None,
       timeout: float = READY_TIMEOUT) -> Cluster:
    """Create hosts node0..node<nodes-1> and return the cluster. If the same cluster is already
    up and healthy it is returned as is (`.reused` is True); a different one needs `force`."""
    tools = require()
    if not 1 <= nodes <= network.MAX_HOSTS:
        raise SimlanError(f"--nodes must be between 1 and {network.MAX_HOSTS}, got {nodes}", code=2)
    if cpus not in ("none", "auto"):
        raise SimlanError(f"--cpus must be auto or none, got {cpus!r}", code=2)
    if not 1 <= syn_retries <= 10:
        raise SimlanError(f"--syn-retries must be between 1 and 10, got {syn_retries}", code=2)
    sdir = state_dir(state)
    inv = Path(inventory_dir or DEFAULT_INVENTORY).resolve()
    python = python or venv_python()
    if not os.access(python, os.X_OK):
        raise SimlanError(f"--python {python}: not an executable file; give the Python the hosts "
                          "should run (default: the venv Python running simlan)", code=2)
    with locked(sdir):
        existing = load(sdir)
        if existing:
            wanted = (nodes, rate, cpus, syn_retries, str(inv), python)
            have = (len(existing.hosts), existing.rate, existing.cpus, existing.syn_retries,
                    str(existing.inventory_dir), existing.python)
            if not force:
                if wanted == have and existing.healthy():
                    existing.reused = True
                    if not (inv / "hosts.yml").exists():  # removed by hand (git clean): write it again
                        inventory.write(inv, [{"name": h.name, "addr": h.addr} for h in existing.hosts],
                                        existing.key, python, sdir / "ansible-cp")
                    return existing
                why = "unhealthy" if wanted == have else f"{len(existing.hosts)} hosts, rate " \
                    f"{existing.rate or 'unshaped'}, cpus {existing.cpus}"
                raise SimlanError(
                    f"a cluster is already up ({why}; state in {sdir}); run `python -m simlan down` "
                    "first, or `python -m simlan up --force` to recreate it", code=2)
            _teardown(existing, tools)
        return _create(sdir, tools, nodes=nodes, rate=rate, cpus=cpus, syn_retries=syn_retries,
                       inv=inv, python=python, keep=keep, timeout=timeout)


def down(state: str | os.PathLike | None = None) -> bool:
    """Remove the recorded cluster (processes by recorded PID, namespaces, bridge, inventory files,
    state). Returns False when there was nothing to remove. Safe to call twice."""
    tools = require()
    sdir = state_dir(state)
    with locked(sdir):
        cluster = load(sdir)
        if cluster is None:
            return False
        _teardown(cluster, tools)
        return True


# ---- internals ----

def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def _create(sdir: Path, tools: dict[str, str], *, nodes: int, rate: str | None, cpus: str,
            syn_retries: int, inv: Path, python: str, keep: tuple[str, ...], timeout: float) -> Cluster:
    ip, tc = tools["ip"], tools["tc"]
    names = [network.host_name(i) for i in range(nodes)]
    network.check_free(ip, names)
    # Leftovers of a crashed `up` (no cluster.json): only simlan's own files, nothing running.
    shutil.rmtree(sdir / "hosts", ignore_errors=True)
    sdir.mkdir(parents=True, exist_ok=True)
    real_home = pwd.getpwuid(0).pw_dir
    allowed = sorted(os.sched_getaffinity(0))
    hosts = [Host(name=n, addr=network.host_addr(i), dir=str(sdir / "hosts" / n),
                  cpu=allowed[i % len(allowed)] if cpus == "auto" else None)
             for i, n in enumerate(names)]
    cluster = Cluster(state_dir=sdir, hosts=hosts, inventory_dir=inv, python=python, rate=rate,
                      cpus=cpus, syn_retries=syn_retries, real_home=real_home,
                      created_by=os.getpid(), created_at=time.time())
    cluster.save()  # recorded before anything exists, so a failed `up` can be undone by `down`
    try:
        for f in (cluster.key, cluster.key.with_suffix(".pub")):
            f.unlink(missing_ok=True)
        run([tools["ssh-keygen"], "-q", "-t", "ed25519", "-N", "", "-C", "simlan-client",
             "-f", str(cluster.key)], what="ssh-keygen (client key)")
        pubkey = cluster.key.with_suffix(".pub").read_text()
        keep_list = keep_paths(real_home, python, keep)
        keep_tmp = keep_tmp_paths(python, keep)
        for h in hosts:
            write_host_files(host=h.name, addr=h.addr, host_dir=Path(h.dir),
                             all_hosts=[(x.name, x.addr) for x in hosts], client_pubkey=pubkey,
                             real_home=real_home, keep=keep_list, keep_tmp=keep_tmp,
                             syn_retries=syn_retries, ssh_keygen=tools["ssh-keygen"])
        network.create_bridge(ip)
        for h in hosts:
            network.create_host_link(ip, tc, h.name, h.addr, rate)
        for h in hosts:
            _start_host(cluster, h, tools)
            cluster.save()
        _wait_ready(cluster, timeout)
        inventory.write(inv, [{"name": h.name, "addr": h.addr} for h in hosts], cluster.key, python,
                        sdir / "ansible-cp")
        cluster.inventory_written = True
        cluster.save()
    except BaseException:
        try:
            _teardown(cluster, tools)
        except SimlanError as cleanup_error:
            print(f"simlan: warning: cleanup after the failed up: {cleanup_error}", file=sys.stderr)
        raise
    return cluster


def _start_host(cluster: Cluster, h: Host, tools: dict[str, str]) -> None:
    """Start the host's PID 1 (init.sh) in new mount/PID/UTS namespaces inside its netns."""
    argv = [tools["ip"], "netns", "exec", network.netns_name(h.name),
            tools["unshare"], "--mount", "--pid", "--uts", "--fork", "--mount-proc",
            "--propagation", "private", "--kill-child", tools["bash"], str(Path(h.dir) / "init.sh")]
    cpu = h.cpu

    def pin() -> None:  # inherited by PID 1 and so by every process of the host
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    log_path = Path(h.dir) / "init.log"
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=cluster.host_env(h.name),
                                preexec_fn=pin if cpu is not None else None)
    h.unshare_pid, h.unshare_start = proc.pid, start_time(proc.pid)
    deadline = time.monotonic() + 5
    while True:
        if proc.poll() is not None:
            raise SimlanError(f"{h.name}: host init exited at once (exit {proc.returncode}): "
                              f"{_tail(log_path)}")
        kids = children(proc.pid) if _comm(proc.pid) == "unshare" else []
        if kids:
            h.pid1, h.pid1_start = kids[0], start_time(kids[0])
            return
        if time.monotonic() > deadline:
            raise SimlanError(f"{h.name}: unshare did not start the host's PID 1 within 5 s")
        time.sleep(0.005)


def _wait_ready(cluster: Cluster, timeout: float) -> None:
    """Wait until every host's sshd greets on port 22, or fail naming the host and its log."""
    deadline = time.monotonic() + timeout
    pending = list(cluster.hosts)
    while pending:
        for h in list(pending):
            if not h.alive:
                raise SimlanError(f"{h.name}: host init failed: {_tail(Path(h.dir) / 'init.log')}")
            if ssh_answers(h.addr, timeout=0.2):
                pending.remove(h)
        if pending:
            if time.monotonic() > deadline:
                h = pending[0]
                raise SimlanError(
                    f"{h.name}: sshd did not answer on {h.addr}:22 within {timeout:g} s; see "
                    f"{Path(h.dir) / 'sshd.log'} ({_tail(Path(h.dir) / 'sshd.log', 1)})")
            time.sleep(0.02)


def _teardown(cluster: Cluster, tools: dict[str, str]) -> None:
    """Remove everything recorded for `cluster`, tolerating what is already gone."""
    ip = tools["ip"]
    for h in cluster.hosts:  # SIGKILL of PID 1 ends every process of the host
        kill_recorded(h.pid1, h.pid1_start)
    for h in cluster.hosts:
        wait_gone(h.pid1, h.pid1_start)
        # unshare ignores SIGTERM while it waits; it exits when its child does. If PID 1 was never
        # found (a failed up), kill unshare itself: --kill-child then takes the child with it.
        if not wait_gone(h.unshare_pid, h.unshare_start, timeout=2):
            kill_recorded(h.unshare_pid, h.unshare_start)
            wait_gone(h.unshare_pid, h.unshare_start)
    for h in cluster.hosts:
        network.delete_netns(ip, h.name)
    network.delete_bridge(ip)
    if cluster.inventory_written:
        inventory.remove(cluster.inventory_dir)
    shutil.rmtree(cluster.state_dir, ignore_errors=True)
