"""`simlan link node1 --delay 3ms --jitter 8ms --loss 0.5%`: a Wi-Fi-like link, without netem.

This kernel has no netem (nor fq, so no earliest-departure-time pacing either): only tbf and htb shape.
So the host's outgoing packets on eth0 go through an NFQUEUE (iptables, mangle POSTROUTING, in the host's
network namespace, `--queue-bypass`: with no listener they pass) to a small process of simlan's in that
namespace, which holds each packet for `delay` plus a random part (uniform in 0..2 x `jitter`, so the mean
added is delay + jitter; in order, as a Wi-Fi link rarely reorders) and then lets it go, or drops it with
probability `loss`. Both directions of a link between two shaped hosts are delayed: the round trip gets
2 x (delay + jitter) on average. The kernel segments GSO packets before queueing them, so a loss is one
MTU-sized packet, as on the air.

The delayer speaks nfnetlink_queue itself (stdlib sockets; no libnetfilter_queue): copy mode META (ids
only, no payload), one verdict per packet. It is recorded in cluster.json (pid and start time) and ended
by `link --clear`, by a new `link`, or by `down`.
"""

from __future__ import annotations

import argparse
import heapq
import os
import random
import re
import signal
import socket
import struct
import subprocess
import sys
import time

from simlan.errors import SimlanError

QUEUE = 7  # the NFQUEUE number in each host's namespace (one queue per namespace)
NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS = 1, 2
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_DROP, NF_ACCEPT = 0, 1
NLM_F_REQUEST = 1
_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def parse_time(text: str, what: str) -> float:
    """'3ms' -> 0.003 (us, ms, s)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(us|ms|s)\s*", text or "")
    if not m:
        raise SimlanError(f"--{what} {text!r}: not a time; use e.g. --{what} 3ms (us, ms, s)", code=2)
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_loss(text: str) -> float:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*%\s*", text or "")
    if not m or float(m.group(1)) >= 100:
        raise SimlanError(f"--loss {text!r}: not a percent below 100; use e.g. --loss 0.5%", code=2)
    return float(m.group(1)) / 100


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, queue: int, attrs: bytes, seq: int = 0) -> bytes:
    body = struct.pack("BBH", socket.AF_UNSPEC, 0, socket.htons(queue)) + attrs
    return struct.pack("IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | kind, NLM_F_REQUEST, seq, 0) + body


def _packet_ids(data: bytes):
    """The packet ids of the NFQNL_MSG_PACKET messages in one netlink read."""
    off = 0
    while off + 16 <= len(data):
        length, kind = struct.unpack_from("IH", data, off)
        if length < 16:
            return
        if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            a = off + 20  # nlmsghdr (16) + nfgenmsg (4)
            while a + 4 <= off + length:
                alen, atype = struct.unpack_from("HH", data, a)
                if alen < 4:
                    break
                if atype & 0x7FFF == NFQA_PACKET_HDR:
                    yield struct.unpack_from("!I", data, a + 4)[0]
                a += (alen + 3) & ~3
        off += (length + 3) & ~3


def serve(delay: float, jitter: float, loss: float, queue: int = QUEUE) -> None:
    """Hold and release (or drop) every queued packet until SIGTERM. Runs in the host's namespace."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.bind((0, 0))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    bind = struct.pack("BBH", NFQNL_CFG_CMD_BIND, 0, socket.htons(socket.AF_INET))
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_CMD, bind)))
    params = struct.pack("!IB", 0, NFQNL_COPY_META)
    sock.send(_message(NFQNL_MSG_CONFIG, queue, _attr(NFQA_CFG_PARAMS, params)))
    rng = random.Random()
    held: list[tuple[float, int, int]] = []  # (release time, order, packet id)
    last, order = 0.0, 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, pid = heapq.heappop(held)
            verdict = NF_DROP if loss and rng.random() < loss else NF_ACCEPT
            answer = _attr(NFQA_VERDICT_HDR, struct.pack("!II", verdict, pid))
            sock.send(_message(NFQNL_MSG_VERDICT, queue, answer))
        sock.settimeout(max(0.0, held[0][0] - time.monotonic()) if held else None)
        try:
            data = sock.recv(1 << 16)
        except TimeoutError:
            continue
        except OSError:  # ENOBUFS: the kernel dropped queued packets (they count as lost)
            continue
        arrived = time.monotonic()
        for pid in _packet_ids(data):
            last = max(last, arrived + delay + rng.uniform(0, 2 * jitter))  # in order
            order += 1
            heapq.heappush(held, (last, order, pid))


def _iptables(netns: str, action: str) -> list[str]:
    return ["ip", "netns", "exec", netns, "iptables", "-w", "-t", "mangle", action, "POSTROUTING", "-o",
            "eth0", "-j", "NFQUEUE", "--queue-num", str(QUEUE), "--queue-bypass"]


def start(netns: str, delay: float, jitter: float, loss: float) -> int:
    """Start the delayer in `netns` and send eth0's outgoing packets through it; returns its pid."""
    proc = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-m", "simlan.wifi", "--delay",
                             str(delay), "--jitter", str(jitter), "--loss", str(loss)],
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(0.3)  # bound to its queue before packets go there (--queue-bypass covers the gap anyway)
    if proc.poll() is not None:
        raise SimlanError(f"{netns}: the link delayer exited at once (code {proc.returncode}); does the "
                          "kernel offer NFQUEUE (CONFIG_NETFILTER_NETLINK_QUEUE)?")
    subprocess.run(_iptables(netns, "-D"), capture_output=True, check=False)  # one rule, not two
    out = subprocess.run(_iptables(netns, "-A"), capture_output=True, text=True, check=False)
    if out.returncode != 0:
        os.kill(proc.pid, signal.SIGTERM)
        raise SimlanError(f"{netns}: iptables refused the NFQUEUE rule: {out.stderr.strip()}")
    return proc.pid


def stop(netns: str, pid: int | None, started: int | None) -> None:
    """Take the rule out (packets pass unheld again), then end the delayer."""
    from simlan.system import kill_recorded, wait_gone

    subprocess.run(_iptables(netns, "-D"), capture_output=True, check=False)
    if pid:
        kill_recorded(pid, started, signal.SIGTERM)
        wait_gone(pid, started)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simlan.wifi", description="the link delayer (run by simlan)")
    p.add_argument("--delay", type=float, required=True)
    p.add_argument("--jitter", type=float, default=0.0)
    p.add_argument("--loss", type=float, default=0.0)
    a = p.parse_args(argv)
    serve(a.delay, a.jitter, a.loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
