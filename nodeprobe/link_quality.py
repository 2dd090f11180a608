"""What the links to this rank's peers do to small messages (jitter) and to segments (loss), read inside
the gloo smoke test (nodeprobe/smoke.py) after its collectives.

- Latency: the times of LATENCY_REPS all-reduces of one float, each after a barrier: their median and 90th
  percentile (for the record: on a busy node they hold the ranks' scheduling too).
- Loss: the kernel's own count of gloo's TCP connections to the peers (TCP_INFO of each socket this process
  holds, the store's left out): segments sent with data and segments retransmitted since the process group
  was made, less the retransmissions the peer reported as duplicates (D-SACK: on a busy node the timer
  fires before the ACK comes, measured here as 1-2 % of segments on a perfect link, all of them
  duplicates). What is left, per segment sent, is the share the link lost (a single lost segment counts as
  none: MIN_LOST_SEGMENTS). With it the smoothed round trip
  and its mean deviation (rttvar): the kernel's jitter of the connection, which, unlike the latency of a
  small all-reduce, does not wait for the ranks' threads to be scheduled (p90 - p50 of those latencies:
  up to 3.6 ms on a perfect link of this loaded machine).

The control host turns both into a share of the run's step (ddplab/preflight/link_cost.py).
"""

from __future__ import annotations

import os
import socket
import statistics
import struct
import time

LATENCY_REPS = 40
# rttvar a busy wired node shows (its ACKs wait for the CPU; measured under 0.5 ms on this machine's simulated
# hosts): jitter costs a step only above it (ddplab/preflight/link_cost.py)
JITTER_FLOOR_MS = 1.0
# Segments lost (not D-SACK'd) that count as a lossy link: one alone is noise. A healthy wired link of this
# loaded 2-core machine lost 1 of 12,072 once in a CI run (a full veth backlog, or a tail probe whose D-SACK
# had not come back when the counts were read) and preflight advised a cable; the Wi-Fi-like link (0.2 %)
# lost 2 to 8 of about 3,150.
MIN_LOST_SEGMENTS = 2
TCP_INFO_LEN = 232  # enough for bytes_retrans (Linux >= 4.19); older kernels return less: fields are skipped
# Offsets in struct tcp_info (include/uapi/linux/tcp.h): u32 unless said
OFFSETS = {"rtt_us": 68, "rttvar_us": 72, "total_retrans": 100, "min_rtt_us": 148, "data_segs_out": 156,
           "dsack_dups": 216}


def latency(dist, torch, reps: int = LATENCY_REPS) -> dict:
    """Median and 90th percentile (ms) of `reps` one-float all-reduces, each after a barrier."""
    t = torch.zeros(1)
    dist.all_reduce(t)  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        times.append(time.perf_counter() - t0)
    times.sort()
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    return {"reps": reps, "p50_ms": round(statistics.median(times) * 1e3, 3), "p90_ms": round(p90 * 1e3, 3),
            "max_ms": round(times[-1] * 1e3, 3)}


def _info(sock: socket.socket) -> dict | None:
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_LEN)
    return {k: struct.unpack_from("<I", raw, off)[0] for k, off in OFFSETS.items() if off + 4 <= len(raw)}


def _tcp_sockets(skip_port: int) -> list[tuple[str, dict]]:
    """(peer address, tcp_info) of every connected TCP socket of this process, except those to or from
    `skip_port` (the store)."""
    out = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if not os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        with sock:
            try:
                if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                    continue
                peer, local = sock.getpeername(), sock.getsockname()
                if skip_port in (peer[1], local[1]):
                    continue
                info = _info(sock)
            except OSError:  # a listening socket has no peer
                continue
        if info:
            out.append((peer[0], info))
    return out


def tcp_counts(skip_port: int) -> dict:
    """Per peer address: data segments sent, retransmitted, round trip and its deviation (worst socket)."""
    peers: dict[str, dict] = {}
    for addr, info in _tcp_sockets(skip_port):
        p = peers.setdefault(addr, {"sockets": 0, "data_segs_out": 0, "retrans": 0, "dsack_dups": 0,
                                    "rtt_ms": 0.0, "rttvar_ms": 0.0, "min_rtt_ms": None})
        p["sockets"] += 1
        p["data_segs_out"] += info.get("data_segs_out", 0)
        p["retrans"] += info.get("total_retrans", 0)
        p["dsack_dups"] += info.get("dsack_dups", 0)
        p["rtt_ms"] = max(p["rtt_ms"], info.get("rtt_us", 0) / 1e3)
        p["rttvar_ms"] = max(p["rttvar_ms"], info.get("rttvar_us", 0) / 1e3)
        if "min_rtt_us" in info:
            low = info["min_rtt_us"] / 1e3
            p["min_rtt_ms"] = low if p["min_rtt_ms"] is None else min(p["min_rtt_ms"], low)
    for p in peers.values():
        p["loss"] = lost_share(p["retrans"], p["dsack_dups"], p["data_segs_out"])
    return peers


def lost_share(retrans: int, dsack_dups: int, sent: int) -> float | None:
    """Segments the link lost per segment sent: retransmissions less those the peer reported as duplicates
    (D-SACK: the first copy had arrived, the timer was too quick, as on a busy node); 0.0 below
    MIN_LOST_SEGMENTS."""
    if not sent:
        return None
    lost = max(0, retrans - dsack_dups)
    return round(lost / sent, 6) if lost >= MIN_LOST_SEGMENTS else 0.0


def worth_weighing(link: dict) -> bool:
    """The link lost segments or jitters above the floor: its cost is weighed against a step of the run."""
    return bool(link.get("loss")) or (link.get("rttvar_ms") or 0.0) > JITTER_FLOOR_MS


def measure(dist, torch, store_port: int) -> dict:
    """The link block of the smoke test's JSON: latency of small all-reduces and the TCP counts."""
    lat = latency(dist, torch)
    peers = tcp_counts(store_port)
    sent = sum(p["data_segs_out"] for p in peers.values())
    retrans = sum(p["retrans"] for p in peers.values())
    dups = sum(p["dsack_dups"] for p in peers.values())
    return {**lat, "peers": peers, "data_segs_out": sent, "retrans": retrans, "dsack_dups": dups,
            "loss": lost_share(retrans, dups, sent),
            "rtt_ms": max((p["rtt_ms"] for p in peers.values()), default=None),
            "rttvar_ms": max((p["rttvar_ms"] for p in peers.values()), default=None)}
