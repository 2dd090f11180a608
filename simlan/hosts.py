"""A simlan cluster as recorded in `<state>/cluster.json`: its hosts (`Host`) and what can be done
with them from the root namespace (`Cluster`: run commands inside a host, log in over SSH, status).
Creating and removing clusters is in simlan.lifecycle; failures on purpose in simlan.faults."""

from __future__ import annotations

import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simlan import cpuquota, memlimit
from simlan.defaults import DEFAULT_SYN_RETRIES, READY_TIMEOUT, SSHD
from simlan.errors import SimlanError
from simlan.probe import comm, ssh_answers
from simlan.state import save
from simlan.stockinit import LOGIN_USER, SSHD_CONFIG, SSHD_LOG
from simlan.system import SYSTEM_PATH, cmdline, is_alive, processes_in_pid_namespace


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
    cgroup: str | None = None  # its own cgroup when it has a --cpu-quota
    mem_cgroup: str | None = None  # its own memory cgroup when it has a --mem-limit
    freezer: str | None = None  # its cgroup in the freezer once it was frozen (simlan.freezer)
    link: dict | None = None  # a Wi-Fi-like link (simlan.wifi): {"delay", "jitter", "loss", "pid", "start"}

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
    stock: bool = False  # `up --stock`: own Debian root, login as `lab` (simlan.stockinit)
    become_password: str | None = None  # the stock hosts' sudo password of `lab`
    cpu_quota: dict[str, int] = field(default_factory=dict)  # host -> percent of one core
    mem_limit: dict[str, int] = field(default_factory=dict)  # host -> bytes of memory
    releases: dict[str, str] = field(default_factory=dict)  # stock host -> Debian suite, when not bookworm
    egress: dict | None = None  # the NAT rules added for stock hosts (simlan.egress)
    outsider: bool = False  # a host outside the lab is on the LAN (simlan.outsider)
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

    @property
    def user(self) -> str:
        """The account SSH logs in as."""
        return LOGIN_USER if self.stock else "root"

    @property
    def home(self) -> str:
        """root's home inside a host."""
        return "/root" if self.stock else self.real_home

    def sshd_config(self, name: str) -> str:
        """The sshd configuration file, as the host's sshd sees it."""
        return SSHD_CONFIG if self.stock else str(Path(self.host(name).dir) / "sshd_config")

    def sshd_log(self, name: str, *, inside: bool = False) -> Path:
        """The host's sshd log: as seen inside the host, or (default) from the real machine."""
        h = self.host(name)
        if not self.stock:
            return Path(h.dir) / "sshd.log"
        return Path(SSHD_LOG) if inside else Path(h.dir, "upper", SSHD_LOG.lstrip("/"))

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise SimlanError(f"no host {name!r} in this cluster (hosts: "
                          f"{', '.join(h.name for h in self.hosts)})", code=2)

    def host_env(self, name: str) -> dict[str, str]:
        """The environment of a login on the host (what `exec` runs with)."""
        return {
            "PATH": SYSTEM_PATH, "HOME": self.home, "USER": "root", "LOGNAME": "root",
            "SHELL": "/bin/bash", "LANG": "C.UTF-8", "SIMLAN_HOST": name, "HOSTNAME": name,
            "TERM": os.environ.get("TERM", "dumb"),
        }

    def pin(self, name: str):
        """A preexec_fn that gives a process started from outside the host the host's CPU
        placement and cgroup (processes started inside inherit both from PID 1), or None."""
        cpu, cgroup, mem = self.host(name).cpu, self.host(name).cgroup, self.host(name).mem_cgroup
        if cpu is None and cgroup is None and mem is None:
            return None

        def place() -> None:
            if cpu is not None:
                os.sched_setaffinity(0, {cpu})
            if cgroup is not None:
                cpuquota.join(cgroup)
            if mem is not None:
                memlimit.join(mem)

        return place

    def nsenter_argv(self, name: str) -> list[str]:
        h = self.host(name)
        if not h.alive:
            raise SimlanError(f"{name} is down (its PID 1 is gone); recreate the cluster: "
                              "python -m simlan up --force --nodes N")
        # A stock host's PID 1 pivot_rooted into its own root: enter that root (-r) too.
        root = ["-r"] if self.stock else []
        return ["nsenter", "-t", str(h.pid1), "-n", "-m", "-p", "-u", *root, f"--wdns={self.home}", "--"]

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
        """An OpenSSH client command line that logs into host `name` (as root; stock hosts: as `lab`)
        with the cluster key."""
        return ["ssh", "-i", str(self.key), "-o", "BatchMode=yes", "-o", "UserKnownHostsFile=/dev/null",
                "-o", "StrictHostKeyChecking=no", "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
                f"{self.user}@{self.host(name).addr}", *cmd]

    # ---- health ----
    def sshd_listeners(self, name: str) -> list[int]:
        """Global PIDs of the host's listening sshd (`sshd -D -e -f <cfg>`); sessions excluded."""
        h = self.host(name)
        if not h.alive:
            return []
        # sshd rewrites its command line: "sshd: /usr/sbin/sshd -D -e -f CFG [listener] ...".
        mine = f"{SSHD} -D -e -f {self.sshd_config(name)}"
        return [p for p in processes_in_pid_namespace(h.pid1)
                if comm(p) == "sshd" and mine in " ".join(cmdline(p))]

    def status(self) -> list[dict]:
        """One row per host: name, addr, pid1 (None when dead), sshd state, rate, cpu, quota, ok."""
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
                         "sshd": sshd, "rate": self.rate or "-", "cpu": cpu, "quota": _quota(h, alive),
                         "ok": alive and sshd == "up"})
        return rows

    def healthy(self) -> bool:
        return all(r["ok"] for r in self.status())

    # ---- failures on purpose (simlan.faults) ----
    def kill_host(self, name: str, *, keep_link: bool = False) -> None:
        """Simulate a host dying: cable pulled (unless keep_link), every process SIGKILLed."""
        from simlan import faults

        faults.kill_host(self, name, keep_link=keep_link)

    def revive_host(self, name: str) -> None:
        """Bring a killed host back (new PID 1 and sshd, same files and address, cable in)."""
        from simlan import faults

        faults.revive_host(self, name)

    def freeze_host(self, name: str) -> None:
        """A lid that closes: every process of the host stops where it is (cgroup freezer)."""
        from simlan import faults

        faults.freeze_host(self, name)

    def set_link(self, name: str, delay: str = "0ms", jitter: str = "0ms", loss: str = "0%") -> None:
        """Delay, jitter and loss on the host's outgoing packets (simlan.wifi); all zero: a plain link."""
        from simlan import faults

        faults.set_link(self, name, delay, jitter, loss)

    def thaw_host(self, name: str) -> None:
        """The lid opens again: the frozen processes run on."""
        from simlan import faults

        faults.thaw_host(self, name)

    def sshd(self, name: str, action: str, *, cut: bool = False, timeout: float = READY_TIMEOUT) -> str:
        """Stop, start or restart the host's sshd (`cut`: also kill its SSH sessions)."""
        from simlan import faults

        return faults.sshd(self, name, action, cut=cut, timeout=timeout)

    def down(self) -> None:
        from simlan import lifecycle

        lifecycle.down(self.state_dir)


def _quota(h: Host, alive: bool) -> str:
    """The CPU limit in force on the host ("50%"), read from its cgroup; "-" when it has none."""
    if h.cgroup is None:
        return "-"
    limit = cpuquota.percent(h.cgroup)
    shown = f"{limit}%" if limit is not None else "unlimited"
    if alive and h.pid1 not in cpuquota.members(h.cgroup):
        shown += " (PID 1 not in its cgroup)"
    return shown
