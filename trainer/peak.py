"""The node's fp32 matmul peak, measured once per start, and model FLOPs utilisation (MFU) against it.

A CPU has no datasheet number torch can query, so each rank times a few square fp32 matmuls at its own
intra-op thread count (after setup_threads) and keeps the best: the FLOP/s this rank can reach on dense
GEMM, in ~0.2-0.5 s. Ranks on one node measure at the same time, so they share its cores as they do in
training. MFU = model FLOPs per token x tokens/s of all ranks / the sum of the ranks' peaks (the same
value on every rank, fair to nodes of different speeds).
"""

from __future__ import annotations

import math
import time

import torch

GEMM_N = 512  # 2*N^3 = 0.27 GFLOP per matmul: ~5 ms at 50 GFLOP/s, big enough to reach the GEMM peak
BUDGET_S = 0.3
MIN_REPS = 3


def measure_peak_flops(n: int = GEMM_N, budget_s: float = BUDGET_S, min_reps: int = MIN_REPS) -> float:
    """Best fp32 FLOP/s of an n x n matmul over ~budget_s seconds (at least min_reps timed matmuls)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # first call: packing buffers, page faults
    best, reps, end = math.inf, 0, time.perf_counter() + budget_s
    while reps < min_reps or time.perf_counter() < end:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
        reps += 1
    return 2 * n ** 3 / max(best, 1e-9)


def mfu(flops_per_token: float, tokens_per_sec: float | None, peaks: list[float]) -> float | None:
    """Model FLOPs utilisation of the whole run: None without a throughput or a peak."""
    total = sum(peaks)
    if not tokens_per_sec or total <= 0:
        return None
    return flops_per_token * tokens_per_sec / total
