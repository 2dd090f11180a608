"""Start (or restart) the Slurm daemons on a node without systemd (stdlib only, no package imports).

Shipped alone, as root: ``nodeprobe daemons < SPEC`` (roles/slurm; ddplab/node_command.py: the program first
on stdin, its SPEC, JSON, after it, as every verb shipped alone), because the node may have no init system
that runs services (a simulated stock host: PID 1 is simlan's init.sh). The spec lists daemons in start
order::

    {"daemons": [{"name": "munged", "pidfile": "/run/munge/munged.pid",
                  "argv": ["runuser", "-u", "munge", "--", "/usr/sbin/munged"], "restart": false}, ...]}

A daemon is up when its pid file names a live process whose /proc/<pid>/comm is ``name`` (the kernel
keeps 15 characters). ``restart`` (its configuration changed): a running one gets SIGTERM, by the PID its
own pid file recorded, and is started again once it is gone; nothing is signalled by name. Each daemon
forks into the background itself; this waits until its pid file names it. Prints
``{"started": [...], "restarted": [...], "running": [...]}``; a daemon that does not come up exits 1
with ``{"error": ...}`` naming it and the last lines of its log; a spec that is not this JSON exits 2 with
``{"error": ...}`` saying so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

COMM_LEN = 15  # /proc/<pid>/comm holds the first 15 bytes of the name


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def pid_of(name: str, pidfile: str) -> int | None:
    """The PID the pid file records, when that process is alive and is `name`."""
    try:
        pid = int(_read(pidfile).split()[0])
        comm = _read(f"/proc/{pid}/comm").strip()
        state = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[0]
    except (OSError, ValueError, IndexError):
        return None
    return pid if comm == name[:COMM_LEN] and state != "Z" else None


def wait_for(check, seconds: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(interval)
    return bool(check())


def stop(name: str, pidfile: str, pid: int, grace: float) -> None:
    os.kill(pid, signal.SIGTERM)
    if not wait_for(lambda: pid_of(name, pidfile) != pid, grace):
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: pid_of(name, pidfile) != pid, 5)


def ensure(daemons: list[dict], grace: float = 20.0, start_wait: float = 20.0) -> dict:
    out: dict = {"started": [], "restarted": [], "running": []}
    for d in daemons:
        name, pidfile = d["name"], d["pidfile"]
        pid = pid_of(name, pidfile)
        if pid is not None and d.get("restart"):
            stop(name, pidfile, pid, grace)
            out["restarted"].append(name)
            pid = None
        if pid is not None:
            out["running"].append(name)
            continue
        run = subprocess.run(d["argv"], capture_output=True, text=True, timeout=60, check=False,
                             stdin=subprocess.DEVNULL)
        up = run.returncode == 0 and wait_for(lambda n=name, f=pidfile: pid_of(n, f) is not None, start_wait)
        if run.returncode != 0 or not up:
            said = (run.stderr or run.stdout).strip().splitlines()[-5:]
            raise RuntimeError(f"{name} did not start ({' '.join(d['argv'])} exited {run.returncode}; "
                               f"no live {name} in {pidfile}): {' | '.join(said) or 'no output'}; "
                               f"its log: {d.get('log', 'see the daemon log')}")
        if name not in out["restarted"]:
            out["started"].append(name)
    return out


def read_spec(text: str) -> list[dict]:
    """The daemons of a spec (the JSON above); ValueError saying what is wrong."""
    try:
        daemons = json.loads(text)["daemons"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"the spec on stdin is not {{\"daemons\": [...]}} JSON ({type(e).__name__}: {e})") \
            from None
    if not isinstance(daemons, list) or not all(isinstance(d, dict) for d in daemons):
        raise ValueError("the spec's daemons is not a list of {name, pidfile, argv, restart, log}")
    return daemons


def main(argv: list[str] | None = None, text: str | None = None) -> int:
    """Start the daemons of the spec on stdin (or `text`); print one JSON answer."""
    args = sys.argv[1:] if argv is None else argv
    try:
        if args:
            raise ValueError(f"takes no arguments (its spec comes on stdin after the program), got {args[0]}")
        daemons = read_spec(sys.stdin.read() if text is None else text)
    except ValueError as e:
        print(json.dumps({"error": f"daemons: {e}"}))
        return 2
    try:
        result = ensure(daemons)
    except (RuntimeError, OSError, ValueError, KeyError, subprocess.TimeoutExpired) as e:
        print(json.dumps({"error": str(e)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
