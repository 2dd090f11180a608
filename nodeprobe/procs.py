"""Process probes: ``port-holder`` and ``lab-processes`` (stdlib only, read from /proc).

/proc/net/tcp{,6} lists the sockets of the reader's network namespace and /proc/<pid>/fd the
processes of its PID namespace, which on a simulated host are exactly that host's.
"""

from __future__ import annotations

import os
import socket

LISTEN = "0A"
RANK_MARKERS = ("-m trainer", "trainer/__main__.py", "torchrun", "torch.distributed.run",
                "torch/distributed/run.py")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def cmdline(pid: int) -> str | None:
    raw = _read(f"/proc/{pid}/cmdline")
    if raw is None:
        return None
    return raw.rstrip("\0").replace("\0", " ")


def ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat")
    if not stat:
        return None
    # comm may contain spaces and parentheses: split after the last ')'
    return int(stat[stat.rindex(")") + 2:].split()[1])


def pids() -> list[int]:
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def _hex_addr(hex_addr: str, v6: bool) -> str:
    raw = bytes.fromhex(hex_addr)
    if v6:
        # four little-endian 32-bit words
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
        return socket.inet_ntop(socket.AF_INET6, raw)
    return socket.inet_ntop(socket.AF_INET, raw[::-1])


def listening_sockets(port: int) -> list[dict]:
    found = []
    for name, v6 in (("tcp", False), ("tcp6", True)):
        text = _read(f"/proc/net/{name}")
        if not text:
            continue
        for line in text.splitlines()[1:]:
            parts = line.split()
            if len(parts) < 10 or parts[3] != LISTEN:
                continue
            addr, _, hex_port = parts[1].partition(":")
            if int(hex_port, 16) == port:
                found.append({"family": "ipv6" if v6 else "ipv4", "address": _hex_addr(addr, v6),
                              "inode": int(parts[9])})
    return found


def socket_owners(inodes: set[int]) -> dict[int, list[int]]:
    owners: dict[int, list[int]] = {}
    wanted = {f"socket:[{i}]": i for i in inodes}
    for pid in pids():
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target in wanted:
                owners.setdefault(wanted[target], [])
                if pid not in owners[wanted[target]]:
                    owners[wanted[target]].append(pid)
    return owners


def port_holder(port: int) -> dict:
    socks = listening_sockets(port)
    owners = socket_owners({s["inode"] for s in socks})
    holders = []
    for s in socks:
        for pid in owners.get(s["inode"], []):
            holders.append({"pid": pid, "ppid": ppid(pid), "cmdline": cmdline(pid),
                            "family": s["family"], "address": s["address"]})
    unowned = [s for s in socks if s["inode"] not in owners]
    return {
        "probe": "port-holder",
        "host": socket.gethostname(),
        "port": port,
        "free": not socks,
        "holders": holders,
        "unknown_holder": bool(unowned),
        "nodeprobe_listener": bool(holders) and all("nodeprobe" in (h["cmdline"] or "") for h in holders),
    }


def _ancestors() -> set[int]:
    seen, pid = set(), os.getpid()
    while pid and pid not in seen:
        seen.add(pid)
        pid = ppid(pid) or 0
    return seen


def _role(cmd: str) -> str:
    """tmux (a server may outlive its run harmlessly), launcher (a shell), or rank (anything else)."""
    argv0 = os.path.basename(cmd.split(" ", 1)[0])
    if argv0.startswith("tmux"):
        return "tmux"
    if argv0 in ("sh", "bash", "dash", "zsh") and not any(m in cmd for m in RANK_MARKERS):
        return "launcher"
    return "rank"


def _lab_env(pid: int) -> str | None:
    """DDPLAB_ROOT from the process's environment (every rank ddplab starts carries it)."""
    raw = _read(f"/proc/{pid}/environ")
    for item in (raw or "").split("\0"):
        if item.startswith("DDPLAB_ROOT="):
            return item[len("DDPLAB_ROOT="):]
    return None


def lab_processes(root: str, shared: bool = False) -> dict:
    """Processes of this lab: DDPLAB_ROOT in their environment, the lab path in their command line,
    a torchrun/trainer whose cwd is in the lab, or (``shared=False``) any ``-m trainer``.

    ``shared``: this machine also runs other labs or people's trainers (the local inventory's
    hosts are one machine), so a trainer counts only when it is tied to this lab folder.
    """
    lab = os.path.realpath(os.path.expanduser(root))
    skip = _ancestors()
    found = []
    for pid in pids():
        if pid in skip:
            continue
        cmd = cmdline(pid)
        if not cmd or "nodeprobe" in cmd:
            continue
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            cwd = None
        env_root = _lab_env(pid)
        in_lab = lab in cmd or root in cmd or (
            env_root is not None and os.path.realpath(os.path.expanduser(env_root)) == lab)
        trainer = "-m trainer" in cmd and not shared
        torchrun_in_lab = any(m in cmd for m in RANK_MARKERS) and cwd is not None \
            and (cwd + "/").startswith(lab + "/")
        if not (in_lab or trainer or torchrun_in_lab):
            continue
        parent = ppid(pid)
        found.append({"pid": pid, "ppid": parent, "orphan": parent == 1, "cmdline": cmd, "cwd": cwd,
                      "role": _role(cmd)})
    return {"probe": "lab-processes", "host": socket.gethostname(), "root": lab, "processes": found,
            "ranks": [p["pid"] for p in found if p["role"] in ("rank", "launcher")]}
