"""``python -m ddplab rdzv-store``: the rendezvous of an elastic run, on the control host.

torchrun's elastic agents meet in a c10d store. Hosted by a training node (torchrun's default), it dies
with that node, and the group can never re-form without it. Here it runs on the control host, which
trains nothing: a long-lived ``torch.distributed.TCPStore`` server; every node's agent is a client
(``--rdzv-backend c10d --rdzv-endpoint ADDR:PORT``; torchrun hosts the store itself only when the
endpoint is one of its own addresses). etcd (Debian's package) was the other candidate: it needs a
package on the control host and torch's etcd backend needs python-etcd with etcd's v2 API, which
Debian's etcd 3.4 serves only with a flag. The store needs nothing but the torch the control host has.

    python -m ddplab rdzv-store start --state DIR --port P --toward ADDR --allow ADDR...
                                                    # {"host", "port", "pid", "allow", "reused"}
    python -m ddplab rdzv-store stop --state DIR    # {"stopped": pid | null}
    python -m ddplab rdzv-store serve --bind A --port P --allow ADDR... --ready FILE   # (start runs it)

``--toward`` is a node's address: the store is announced on the control host's own address on the
route to it (no packet is sent). A store already running for the same state folder is reused, so
running start twice changes nothing.

Reachable by the lab's nodes only. torch unpickles what it reads from the store, so whoever reaches the
port could run code on every node. A master TCPStore listens on every interface whatever host it is
given; here it gets a socket of ours instead (``master_listen_fd``), bound to the one address the nodes
dial, with a classic BPF filter on it (SO_ATTACH_FILTER): the kernel drops every packet, SYN included,
whose IPv4 source is not a node of the inventory or the control host's own address. Nothing else on
the network can connect, join the run or stop it. No root needed.

It ends with the run: ``serve`` exits when no node has been connected for --idle-seconds (600; a run
that ended while nobody waited, a failed launch), on stop.yml, or after --hours (72) at the latest.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from ddplab.errors import DdplabError

STATE = "rdzv-store.json"
READY_TIMEOUT_S = 60.0
IDLE_S = 600.0  # no node connected this long: the run is over and the store ends
IDLE_POLL_S = 2.0


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


def ipv4_of(addr: str) -> str:
    """A node's inventory address as the IPv4 address its packets come from (hostnames resolved here)."""
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except (OSError, IndexError) as e:
        raise DdplabError(f"the node address {addr} does not resolve to an IPv4 address on the control host "
                          f"({e}); the rendezvous store lets in the lab's nodes by address: set ddplab_addr "
                          "to the node's IPv4 address") from None


def start(folder: Path, port: int, toward: str, allow: list[str], hours: float,
          idle_s: float = IDLE_S) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    host = local_addr_toward(toward)
    allowed = sorted({ipv4_of(a) for a in allow} | {host})
    state = read_state(folder)
    if state and state.get("port") == port and state.get("allow") == allowed:
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
        [sys.executable, "-m", "ddplab", "rdzv-store", "serve", "--bind", host, "--port", str(port),
         *(a for addr in allowed for a in ("--allow", addr)), "--ready", str(ready), "--hours", str(hours),
         "--idle-seconds", str(idle_s), "--state", str(folder)],
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
    state = {"pid": proc.pid, "port": port, "host": host, "allow": allowed, "started": time.time()}
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


SO_ATTACH_FILTER = 26  # <asm-generic/socket.h>
SKF_NET_OFF = -0x100000  # classic BPF: offsets from the network (IP) header
BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06


def source_filter(allowed: list[str]) -> bytes:
    """A classic BPF program that accepts a packet only when its IPv4 source is one of ``allowed``."""
    ins = [(BPF_LD_W_ABS, 0, 0, (SKF_NET_OFF + 12) & 0xFFFFFFFF)]  # the IPv4 header's source address
    for i, addr in enumerate(allowed):  # equal: jump to the last instruction (accept); else the next test
        ins.append((BPF_JEQ_K, len(allowed) - i, 0, struct.unpack("!I", socket.inet_aton(addr))[0]))
    ins += [(BPF_RET_K, 0, 0, 0), (BPF_RET_K, 0, 0, 0xFFFFFFFF)]  # drop; accept
    return b"".join(struct.pack("HBBI", *i) for i in ins)


def lab_only_socket(bind: str, port: int, allowed: list[str]) -> tuple[socket.socket, object]:
    """A listening TCP socket on bind:port that the kernel lets only ``allowed`` sources reach: (socket,
    the filter's buffer, which must outlive it)."""
    prog = source_filter(allowed)
    buf = ctypes.create_string_buffer(prog, len(prog))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                    struct.pack("HL", len(prog) // 8, ctypes.addressof(buf)))  # struct sock_fprog
    sock.bind((bind, port))
    sock.listen(512)
    return sock, buf


def connections(port: int) -> int:
    """Established TCP connections whose local port is ``port`` (/proc/net/tcp: the store's side)."""
    n = 0
    with contextlib.suppress(OSError), open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                n += 1
    return n


def serve(bind: str, port: int, allowed: list[str], ready: Path, hours: float, idle_s: float) -> None:
    import datetime

    import torch.distributed as dist

    sock, _filter = lab_only_socket(bind, port, allowed)
    store = dist.TCPStore(bind, port, is_master=True, wait_for_workers=False, use_libuv=False,  # noqa: F841
                          timeout=datetime.timedelta(seconds=300), master_listen_fd=sock.fileno())
    own = connections(port)  # the master's own client
    ready.write_text(str(os.getpid()))
    print(f"ddplab: rendezvous store listening on {bind}:{port} (pid {os.getpid()}), reachable from "
          f"{', '.join(allowed)} only", flush=True)
    # os._exit: the store's thread polls our socket; a normal exit would close it under that thread
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    end, last_seen = time.monotonic() + hours * 3600, time.monotonic()
    while time.monotonic() < end:
        time.sleep(IDLE_POLL_S)
        if connections(port) > own:
            last_seen = time.monotonic()
        elif time.monotonic() - last_seen > idle_s:
            print(f"ddplab: no node connected for {idle_s:g} s: the run is over; the store ends", flush=True)
            break
    os._exit(0)


def add_parser(sub):
    p = sub.add_parser("rdzv-store", help="the rendezvous store of an elastic run, on the control host")
    verbs = p.add_subparsers(dest="store_cmd", required=True)
    s = verbs.add_parser("start", help="start it (or reuse the running one); prints host, port, pid")
    s.add_argument("--state", type=Path, required=True, help="folder for the store's state and log")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--toward", required=True, help="a node's address: the store is announced on the "
                   "control host's address on the route to it")
    s.add_argument("--allow", action="append", required=True, metavar="ADDR",
                   help="a node's address (repeat for each): only these reach the store")
    s.add_argument("--hours", type=float, default=72.0)
    s.add_argument("--idle-seconds", type=float, default=IDLE_S)
    t = verbs.add_parser("stop", help="end it")
    t.add_argument("--state", type=Path, required=True)
    v = verbs.add_parser("serve", help="the store itself (start runs it detached)")
    v.add_argument("--bind", required=True, help="the control host's address the nodes dial")
    v.add_argument("--port", type=int, required=True)
    v.add_argument("--allow", action="append", required=True, metavar="IPV4")
    v.add_argument("--ready", type=Path, required=True)
    v.add_argument("--hours", type=float, default=72.0)
    v.add_argument("--idle-seconds", type=float, default=IDLE_S)
    v.add_argument("--state", type=Path, help="the run folder it serves (named in messages)")
    p.set_defaults(func=cmd_rdzv_store)


def cmd_rdzv_store(a) -> int:
    if a.store_cmd == "serve":
        serve(a.bind, a.port, a.allow, a.ready, a.hours, a.idle_seconds)
        return 0
    out = (start(a.state, a.port, a.toward, a.allow, a.hours, a.idle_seconds) if a.store_cmd == "start"
           else stop(a.state))
    print(json.dumps(out))
    return 0
