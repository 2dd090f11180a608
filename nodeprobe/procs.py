"""Processes of the lab on this node, read from /proc (stdlib only, no package imports).

- ``port_holder`` and ``lab_processes``: preflight's probes (``python -m nodeprobe port-holder``,
  ``lab-processes``), which report and never signal.
- ``stale``: the stale_processes role's finder and killer. Shipped alone (``python procs.py --root
  R [--port P] [--run-id RUN] [--replace] [--kill --grace S]``) because stop.yml must also work on a
  node whose synced code is gone. A process is the lab's when its environment has DDPLAB_ROOT=<root>
  (every rank ddplab starts), or when it is a Python/torchrun process running torchrun /
  torch.distributed.run / the trainer module and names the lab folder (leftovers started by hand;
  ``hand_started_rank``): an editor or git working on a file in the lab folder is never one. Prints
  ``{"found", "live_runs", "refused", "holders", "others", "by_hand", "errors", "killed", "survivors"}``;
  with errors nothing is signalled.

What may be signalled (``decide``, pure, unit-tested):
- Only processes whose owner (real uid in /proc/<pid>/status) is the probe's user. Another user's
  lab processes are listed in ``others`` and left alone.
- Only processes ddplab started (DDPLAB_ROOT=<root> in their environment). A torchrun or trainer started
  by hand in the lab folder is the user's own run, live whatever ddplab recorded: listed in ``by_hand``
  and left alone, and named as the holder when it listens on the master port.
- A run is *live* on this node while its launcher lives: a process of that run (DDPLAB_RUN_ID in its
  environment) whose command line is torchrun / torch.distributed.run (the rank's torchrun, or the
  systemd-inhibit wrapper in front of it), not a zombie, whatever its parent. torchrun supervises and
  restarts the ranks, so while it is there the run is in progress. Once it is gone, what is left of the
  run (ranks torchrun left behind: they run in their own session and end up under PID 1 or a
  subreaper) are leftovers, and so are ddplab's processes with no run id.
- prepare (no run id): leftovers are ended; a live run is refused with an error naming the run and
  the node, unless ``--replace`` (ddplab_replace_running=true). stop (``--run-id``): every process of
  that run is ended, live or not.
- ``--port``: whatever else listens on it (another program of this user, or another user's process)
  is named in an error (PID, user, command line), never signalled. Another user's socket is seen in
  /proc/net/tcp but not its PID; a scan made as root with ``--uid <login uid>`` names it (read-only:
  ``--kill`` is refused when ``--uid`` is not the probe's own).
- Killing is by PID, the owner re-checked just before: SIGTERM, wait, then SIGKILL.

/proc/net/tcp{,6} lists the sockets of the reader's network namespace and /proc/<pid>/fd the
processes of its PID namespace, which on a simulated host are exactly that host's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import sys
import time

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
                              "uid": int(parts[7]), "inode": int(parts[9])})
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


def environ(pid: int) -> dict[str, str]:
    raw = _read(f"/proc/{pid}/environ")
    return dict(item.split("=", 1) for item in (raw or "").split("\0") if "=" in item)


def _lab_env(pid: int) -> str | None:
    """DDPLAB_ROOT from the process's environment (every rank ddplab starts carries it)."""
    return environ(pid).get("DDPLAB_ROOT")


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
        # a Python or torchrun program naming the lab folder (a rank started by hand); never an editor
        in_lab = (env_root is not None and os.path.realpath(os.path.expanduser(env_root)) == lab) or (
            python_program(cmd) and (lab in cmd or root in cmd))
        trainer = "-m trainer" in cmd and not shared
        torchrun_in_lab = any(m in cmd for m in RANK_MARKERS) and cwd is not None \
            and (cwd + "/").startswith(lab + "/")
        if not (in_lab or trainer or torchrun_in_lab):
            continue
        parent = ppid(pid)
        found.append({"pid": pid, "ppid": parent, "orphan": parent == 1, "cmdline": cmd, "cwd": cwd,
                      "role": _role(cmd), "run": environ(pid).get("DDPLAB_RUN_ID", ""),
                      "torchrun": bool(LAUNCHER_CMD.search(cmd)), "by_ddplab": env_root is not None})
    return {"probe": "lab-processes", "host": socket.gethostname(), "root": lab, "processes": found,
            "ranks": [p["pid"] for p in found if p["role"] in ("rank", "launcher")]}


# ---------------------------------------------------------------- stale_processes: find and end
PROGRAM = re.compile(r"(^|/)(python[0-9.]*|torchrun)$")
RANK_SCRIPTS = ("/torchrun", "torch/distributed/run.py", "trainer/__main__.py")


def python_program(cmd: str) -> bool:
    """The process runs Python or torchrun (argv[0]), not an editor, a pager, a shell or git."""
    argv = cmd.split()
    return bool(argv) and bool(PROGRAM.search(argv[0]))


def hand_started_rank(cmd: str) -> bool:
    """A torchrun or trainer started without ddplab (no DDPLAB_ROOT), known by its command line: the program
    is Python or torchrun, and it runs torchrun, torch.distributed.run or the trainer module. An editor, a
    pager or git open on a file in the lab folder is none of these, so it is never signalled."""
    if not python_program(cmd):
        return False
    argv = cmd.split()
    if os.path.basename(argv[0]) == "torchrun":
        return True
    return any((a == "-m" and b in ("trainer", "torch.distributed.run")) or a.endswith(RANK_SCRIPTS)
               for a, b in zip(argv, [*argv[1:], ""], strict=True))


LAUNCHER_CMD = re.compile(r"torchrun|torch\.distributed\.run|torch/distributed/run\.py")


def owner(pid: int) -> int | None:
    """The real uid of a process (/proc/<pid>/status Uid), None when it is gone."""
    for line in (_read(f"/proc/{pid}/status") or "").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return None


def user_name(uid: int | None) -> str:
    if uid is None:
        return "?"
    try:
        import pwd
        return pwd.getpwuid(uid).pw_name
    except (ImportError, KeyError):
        return f"uid {uid}"


def _info(pid: int, why: str) -> dict | None:
    cmd = cmdline(pid)
    uid = owner(pid)
    if not cmd or uid is None:
        return None
    env = environ(pid)  # empty for another user's process: its environ is not readable
    return {"pid": pid, "ppid": ppid(pid) or 0, "uid": uid, "user": user_name(uid), "cmd": cmd.strip(),
            "root": env.get("DDPLAB_ROOT", ""), "run": env.get("DDPLAB_RUN_ID", ""),
            "launcher": bool(LAUNCHER_CMD.search(cmd)), "why": why}


def run_processes(root: str, run_id: str = "") -> list[dict]:
    """The lab's rank processes, of every user (of run ``run_id`` only, when given), with why each counts."""
    root = os.path.abspath(root).rstrip("/")
    me = {os.getpid(), os.getppid()}
    found = []
    for pid in pids():
        if pid in me:
            continue
        info = _info(pid, "")
        if info is None:
            continue
        if info["root"] == root:
            why = "ddplab rank of this lab"
        elif hand_started_rank(info["cmd"]) and (root + "/") in info["cmd"]:
            why = "torchrun/trainer command in this lab folder, started by hand"
            info["by_hand"] = True
        else:
            continue
        if run_id and info["run"] != run_id:
            continue
        info["why"] = why + (" (orphan, PPID 1)" if info["ppid"] == 1 else "")
        found.append(info)
    return found


def port_listeners(port: int) -> list[dict]:
    """Who listens on ``port``: one entry per (socket, process), ``pid`` None when the process cannot be
    seen (another user's /proc/<pid>/fd is not readable); ``uid`` is the socket's owner either way."""
    socks = listening_sockets(port)
    owners = socket_owners({s["inode"] for s in socks})
    found = []
    for s in socks:
        for pid in owners.get(s["inode"], [None]):
            info = _info(pid, "") if pid else None
            uid = info["uid"] if info else s["uid"]
            found.append({"pid": pid, "uid": uid, "user": user_name(uid),
                          "cmd": info["cmd"] if info else None})
    return found


def decide(procs: list[dict], listeners: list[dict], uid: int, node: str, port: int | None = None,
           run_id: str = "", replace: bool = False) -> dict:
    """Which processes to end, which runs to refuse, which port holders to name (pure: no /proc, no signal).

    ``procs``: run_processes' lab processes; ``listeners``: port_listeners of the master port; ``uid``: the
    user whose processes may be signalled. Returns ``found`` (to end), ``live_runs`` (refused),
    ``holders`` (named), ``others`` (another user's lab processes, left alone), ``by_hand`` (this user's
    torchrun/trainer started without ddplab: its run is live to ddplab whatever it recorded, left alone)
    and ``errors``.
    """
    mine = [p for p in procs if p["uid"] == uid and not p.get("by_hand")]
    by_hand = [p for p in procs if p["uid"] == uid and p.get("by_hand")]
    others = [p for p in procs if p["uid"] != uid]
    live: dict[str, dict] = {}
    if not run_id:  # stop.yml names its run and ends it live or not; prepare ends leftovers only
        for p in mine:
            if p["launcher"] and p["run"] and p["run"] not in live:
                live[p["run"]] = p
    found, refused = [], []
    for p in mine:
        if p["run"] in live:
            if not replace:
                refused.append(p)
                continue
            p = {**p, "why": p["why"] + f" (live run {p['run']}, replaced: ddplab_replace_running=true)"}
        found.append(p)
    ours = {p["pid"] for p in mine}
    holders = [h for h in listeners if h["pid"] not in ours]
    errors = []
    for run, launcher in ([] if replace else sorted(live.items())):
        pids_ = [p["pid"] for p in refused if p["run"] == run]
        errors.append(
            f"ddplab: error: {node}: run {run} is still running there (torchrun PID {launcher['pid']}, "
            f"{len(pids_)} process(es): {' '.join(map(str, pids_))}); prepare ends only leftovers of runs "
            f"whose torchrun is gone, never a live run; stop it first (ansible-playbook playbooks/stop.yml "
            f"-e ddplab_run_id={run}) or replace it (-e ddplab_replace_running=true)")
    for h in holders:
        who = (f"PID {h['pid']} of user {h['user']}: {h['cmd']}" if h["pid"]
               else f"a process of user {h['user']} that this user cannot see "
                    f"(sudo ss -tlnp 'sport = :{port}' names it)")
        kind = "another user's process" if h["uid"] != uid else "another program"
        errors.append(
            f"ddplab: error: {node}: master port {port} is held by {who}; ddplab ends only its own leftover "
            f"processes, never {kind}; end it yourself (kill {h['pid'] or 'PID'}, as its owner) or choose "
            f"another port (-e ddplab_master_port=N)")
    return {"found": found, "live_runs": sorted(live), "refused": refused, "holders": holders,
            "others": others, "by_hand": by_hand, "errors": errors}


def alive(pid: int) -> bool:
    stat = _read(f"/proc/{pid}/stat")
    return bool(stat) and stat[stat.rindex(")") + 2:].split()[0] != "Z"


def kill_all(pids_: list[int], grace: float) -> list[int]:
    """SIGTERM, up to ``grace`` seconds, then SIGKILL; the PIDs still alive after that."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids_:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(alive(p) for p in pids_):
            time.sleep(0.1)
        pids_ = [p for p in pids_ if alive(p)]
        if not pids_:
            break
    return pids_


def stale(root: str, port: int | None = None, run_id: str = "", kill: bool = False, grace: float = 5,
          replace: bool = False, uid: int | None = None, node: str = "") -> dict:
    """Scan, decide, and (``kill``, and no error) end what ``decide`` found. ``uid`` (default: the probe's)
    lets a scan made as root decide for the login user; such a scan never signals."""
    me = os.getuid()
    uid = me if uid is None else uid
    result = decide(run_processes(root, run_id), port_listeners(port) if port else [], uid,
                    node or socket.gethostname(), port, run_id, replace)
    result.update(uid=uid, killed=[], survivors=[])
    if kill and uid != me:
        result["errors"].append(f"ddplab: error: {node}: --kill for uid {uid} from uid {me}; "
                                "a probe signals only its own user's processes; run it as that user")
    elif kill and result["found"] and not result["errors"]:
        # only our own uid, re-read now: a PID may have been reused since the scan
        targets = [p["pid"] for p in result["found"] if owner(p["pid"]) == me]
        result["survivors"] = kill_all(targets, grace)
        result["killed"] = [p for p in result["found"] if p["pid"] in targets and p["pid"] not in
                            result["survivors"]]
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="procs.py", description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True, help="the lab folder")
    ap.add_argument("--port", default="", help="name whatever else listens on this TCP port ('' = none)")
    ap.add_argument("--run-id", default="", help="only this run's processes, live or not ('' = any run)")
    ap.add_argument("--grace", type=float, default=5, help="seconds between SIGTERM and SIGKILL")
    ap.add_argument("--kill", action="store_true")
    ap.add_argument("--replace", action="store_true", help="also end live runs (ddplab_replace_running)")
    ap.add_argument("--uid", type=int, default=None, help="decide for this user (a read-only scan as root)")
    ap.add_argument("--node", default="", help="the node's inventory name, for messages")
    args = ap.parse_args(argv)
    if args.port and not args.port.isdigit():
        ap.error(f"--port {args.port!r}: expected a port number or ''")
    print(json.dumps(stale(args.root, int(args.port) if args.port else None, args.run_id, args.kill,
                           args.grace, args.replace, args.uid, args.node)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
