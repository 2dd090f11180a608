"""What a node's link (its jitter and loss, measured by the gloo smoke test: nodeprobe/link_quality.py) would
cost each step of the run, as a share of that step (docs/laptops.md, "Wi-Fi", states the rule).

Per step, DDP all-reduces every gradient (4 bytes a parameter) in buckets of DDP_BUCKET_BYTES; a ring
all-reduce over N ranks sends 2(N-1)/N of those bytes from each node, in 2(N-1) rounds per bucket.
- Loss: TCP's window shrinks with each lost segment, so a lossy link carries at most MSS / RTT x
  MATHIS_C / sqrt(p) bytes a second (Mathis et al. 1997); sending the step's segments at that rate costs
  segments x RTT x sqrt(p) / MATHIS_C, and a step that loses a segment at the end of a burst also waits out
  the retransmission timer (at least MIN_RTO_S on Linux).
- Jitter: each round of each bucket waits for its slowest packet, about two deviations (rttvar) above the
  mean round trip. A busy wired node shows some rttvar (its ACKs wait for the CPU), so only what exceeds
  JITTER_FLOOR_MS (nodeprobe/link_quality.py) counts.
- The step: the forward and backward pass of the run's model timed on the node (one thread), plus the
  gradients' all-reduce at the rate the smoke test's own all-reduce reached on this link.
The advice is given when the loss and jitter cost at least ADVISE_FROM of that step.
"""

from __future__ import annotations

import math

from nodeprobe.link_quality import JITTER_FLOOR_MS, worth_weighing
from trainer.sizes import GPTConfig, param_count

ADVISE_FROM = 0.10  # the share of a step from which preflight advises a cable or a low-communication mode
DDP_BUCKET_BYTES = 25 << 20  # torch DDP's default bucket_cap_mb
MSS = 1448  # bytes of data in a TCP segment on a 1500-byte Ethernet/Wi-Fi MTU with timestamps
MATHIS_C = math.sqrt(1.5)
MIN_RTO_S = 0.2  # Linux's TCP_RTO_MIN


def gradient_bytes(sizes: dict) -> int:
    c = GPTConfig(vocab_size=sizes["vocab"], seq_len=sizes["seq_len"], n_layer=sizes["depth"],
                  n_embd=sizes["n_embd"], n_head=sizes["n_head"])
    return 4 * param_count(c)


def step_cost(link: dict, grad_bytes: int, world: int) -> dict:
    """Seconds per step that the link's loss and jitter cost (and how), for `grad_bytes` all-reduced over
    `world` ranks."""
    rtt_s = (link.get("rtt_ms") or 0.0) / 1e3
    rttvar_ms = link.get("rttvar_ms") or 0.0
    loss = link.get("loss") or 0.0
    segments = math.ceil(2 * (world - 1) / world * grad_bytes / MSS)
    buckets = max(1, math.ceil(grad_bytes / DDP_BUCKET_BYTES))
    window = segments * rtt_s * math.sqrt(loss) / MATHIS_C
    rto = max(MIN_RTO_S, rtt_s + 4 * rttvar_ms / 1e3)
    tail = (1 - (1 - loss) ** segments) * rto
    jitter = buckets * 2 * (world - 1) * 2 * max(0.0, rttvar_ms - JITTER_FLOOR_MS) / 1e3
    return {"loss_s": window + tail, "jitter_s": jitter, "total_s": window + tail + jitter,
            "segments": segments, "buckets": buckets}


def assess(smoke: dict, sizes: dict | None, world: int) -> dict | None:
    """The link's cost as a share of the step ({"share": 0.0, ...} for a link without loss or jitter above the
    floor), or None when the cost cannot be weighed: no link measured, or a lossy link and no timed step
    (the run's model is unknown: your own code)."""
    link, bw, compute = smoke.get("link"), smoke.get("bandwidth") or {}, smoke.get("compute_step_s")
    if not link or world < 2:
        return None
    grad = gradient_bytes(sizes) if sizes else 0
    cost = step_cost(link, grad, world)
    if not worth_weighing(link):
        return {**cost, "share": 0.0, "grad_bytes": grad}
    if not sizes or compute is None or not bw.get("median_s"):
        return None
    all_reduce = grad / bw["bytes"] * bw["median_s"]  # at the rate this link reached, its losses included
    step = compute + max(all_reduce, cost["total_s"])
    return {**cost, "compute_s": compute, "all_reduce_s": all_reduce, "step_s": step,
            "share": cost["total_s"] / step, "grad_bytes": grad}
