"""``python -m ddplab rdzv-store``: the rendezvous of an elastic run, on the control host.

torchrun's elastic agents meet in a c10d store. Hosted by a training node (torchrun's default), it dies
with that node, and the group can never re-form without it. Here it runs on the control host, which
trains nothing: a long-lived ``torch.distributed.TCPStore`` server; every node's agent is a client
(``--rdzv-backend c10d --rdzv-endpoint ADDR:PORT``; torchrun hosts the store itself only when the
endpoint is one of its own addresses). etcd (Debian's package) was the other candidate: it needs a
package on the control host and torch's etcd backend needs python-etcd with etcd's v2 API, which
Debian's etcd 3.4 serves only with a flag. The store needs nothing but the torch the control host has.

    python -m ddplab rdzv-store start --state DIR --port P --toward ADDR   # {"host", "port", "pid", "reused"}
    python -m ddplab rdzv-store stop --state DIR                          # {"stopped": pid | null}
    python -m ddplab rdzv-store serve --port P --ready FILE [--hours H]   # (start runs this, detached)

``--toward`` is a node's address: the store is announced on the control host's own address on the
route to it (no packet is sent). A store already running for the same state folder is reused, so
running start twice changes nothing. ``serve`` ends after --hours (72) at the latest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ddplab.errors import DdplabError

STATE = "rdzv-store.json"
READY_TIMEOUT_S = 60.0


def local_addr_toward(addr: str) -> str:
    """The control host's source address for packets to addr (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((addr, 9))
        except OSError as e:
            raise DdplabError(f"no route from the control host to {addr} ({e}); the nodes must reach the "
                              "control host for an elastic run's rendezvous") from None
        return s.getsockname()[0]


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def store_on_port(port: int) -> tuple[int, str] | None:
    """(pid, state folder) of this user's ddplab store serving `port`, if one runs."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode(errors="replace").split("\0")
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
        except OSError:
            continue
        if "rdzv-store" in argv and "serve" in argv and argv[argv.index("--port") + 1:][:1] == [str(port)]:
            state = argv[argv.index("--state") + 1] if "--state" in argv else "?"
            return int(entry), state
    return None


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"rdzv-store" in f.read()
    except OSError:
        return False


def read_state(folder: Path) -> dict | None:
    try:
        state = json.loads((folder / STATE).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) and alive(int(state.get("pid") or 0)) else None


def start(folder: Path, port: int, toward: str, hours: float) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    host = local_addr_toward(toward)
    state = read_state(folder)
    if state and state.get("port") == port:
        return {**state, "host": host, "reused": True}
    if not port_free(port):
        other = store_on_port(port)
        if other:
            pid, state = other
            raise DdplabError(f"port {port} on the control host is held by the rendezvous store of run "
                              f"{Path(state).name} (pid {pid}); end that run (ansible-playbook "
                              f"playbooks/stop.yml -e ddplab_run_id={Path(state).name}) or set "
                              "ddplab_rdzv_port to another free port")
        raise DdplabError(f"port {port} on the control host is taken by another program; the rendezvous "
                          "store of an elastic run needs it: set ddplab_rdzv_port to a free port")
    ready = folder / "rdzv-store.ready"
    ready.unlink(missing_ok=True)
    log = open(folder / "rdzv-store.log", "ab")  # noqa: SIM115 - handed to the detached child
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddplab", "rdzv-store", "serve", "--port", str(port), "--ready", str(ready),
         "--hours", str(hours), "--state", str(folder)],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent)
    log.close()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            tail = (folder / "rdzv-store.log").read_text(errors="replace").strip().splitlines()[-1:]
            raise DdplabError(f"the rendezvous store on the control host did not start on port {port}"
                              f" ({' '.join(tail) or 'no output'}); see {folder / 'rdzv-store.log'}")
        time.sleep(0.05)
    state = {"pid": proc.pid, "port": port, "host": host, "started": time.time()}
    tmp = folder / (STATE + ".tmp")
    tmp.write_text(json.dumps(state) + "\n")
    os.replace(tmp, folder / STATE)
    return {**state, "reused": False}


def stop(folder: Path) -> dict:
    state = read_state(folder)
    if not state:
        return {"stopped": None}
    with contextlib.suppress(ProcessLookupError):
        os.kill(int(state["pid"]), signal.SIGTERM)
    (folder / STATE).unlink(missing_ok=True)
    return {"stopped": state["pid"]}


def serve(port: int, ready: Path, hours: float) -> None:
    import datetime

    import torch.distributed as dist

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,  # noqa: F841 - held open
                          timeout=datetime.timedelta(seconds=300))
    ready.write_text(str(os.getpid()))
    print(f"ddplab: rendezvous store listening on port {port} (pid {os.getpid()})", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(hours * 3600)


def add_parser(sub):
    p = sub.add_parser("rdzv-store", help="the rendezvous store of an elastic run, on the control host")
    verbs = p.add_subparsers(dest="store_cmd", required=True)
    s = verbs.add_parser("start", help="start it (or reuse the running one); prints host, port, pid")
    s.add_argument("--state", type=Path, required=True, help="folder for the store's state and log")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--toward", required=True, help="a node's address: the store is announced on the "
                   "control host's address on the route to it")
    s.add_argument("--hours", type=float, default=72.0)
    t = verbs.add_parser("stop", help="end it")
    t.add_argument("--state", type=Path, required=True)
    v = verbs.add_parser("serve", help="the store itself (start runs it detached)")
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--ready", type=Path, required=True)
    v.add_argument("--hours", type=float, default=72.0)
    v.add_argument("--state", type=Path, help="the run folder it serves (named in messages)")
    p.set_defaults(func=cmd_rdzv_store)


def cmd_rdzv_store(a) -> int:
    if a.store_cmd == "serve":
        serve(a.port, a.ready, a.hours)
        return 0
    out = start(a.state, a.port, a.toward, a.hours) if a.store_cmd == "start" else stop(a.state)
    print(json.dumps(out))
    return 0
