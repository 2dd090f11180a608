"""Which rank is a straggler: one rule for the trainer's warning line (trainer/resilience.py), the run status
(ddplab/status.py, from nodeprobe/run_status.py's figures) and the report (ddplab/report.py).

A rank's speed is its median compute time per sequence (compute_ms / share: the step minus the exposed
all-reduce wait, so waiting for a slow peer does not count, and per sequence, so a rank that --balance gave a
smaller share is still seen as slow). A straggler's median is at least `ratio` times the median of the
others' (RATIO by default, the trainer's --straggler-ratio). Stdlib only: the control host imports it
without torch, and nodeprobe on the nodes beside trainer/.
"""

from __future__ import annotations

import statistics

# A rank computing this many times the others' median is named (the trainer's --straggler-ratio default).
# Two ranks on one loaded machine differed by up to 1.3x here; a throttled or half-speed node by 2x or more.
RATIO = 2.0
# The steps the run status judges a running rank on: its newest metrics records.
WINDOW = 20


def stragglers(medians: list[float], ratio: float = RATIO) -> dict[int, float]:
    """{rank: its median / the median of the others' medians} for every rank at or above `ratio`."""
    out = {}
    for r, m in enumerate(medians):
        rest = [x for i, x in enumerate(medians) if i != r]
        base = statistics.median(rest) if rest else 0.0
        if base > 0 and m / base >= ratio:
            out[r] = m / base
    return out


def named(speeds: dict, ratio: float = RATIO) -> dict:
    """The same rule on {name: compute ms per sequence or None}: {name: times the others' median}; names
    without a figure are left out (at least two figures are needed to compare)."""
    known = {k: v for k, v in speeds.items() if v is not None and v > 0}
    keys = list(known)
    if len(keys) < 2:
        return {}
    return {keys[i]: x for i, x in stragglers([known[k] for k in keys], ratio).items()}


def per_sequence(records: list[dict], skip: int = 1) -> float | None:
    """Median compute ms per sequence over `records` (metrics.rank*.jsonl rows) after the first `skip`
    (the first step builds buffers and warms caches); None when they carry no compute time."""
    values = [r["compute_ms"] / (r.get("share") or 1) for r in records[skip:]
              if r.get("compute_ms") is not None]
    return statistics.median(values) if values else None
