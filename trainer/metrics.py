"""Honest measurements: the comm hook's timer, per-step JSONL, a progress line, percentiles, the summary.

Definitions (per optimizer step, on each rank):
- dt_ms: wall time of the whole step (data, forward, backward incl. waiting for the all-reduce, optimizer).
- allreduce_ms: from the first gradient bucket handed to the all-reduce until the last one finished
  (measured in the comm hook, trainer/comm.py: launch -> future done, via a then-callback). Part of it
  overlaps backward. allreduce_bytes: what this rank handed to the all-reduce (after compression).
- exposed_ms: the part that cannot have overlapped: from the launch of the last bucket (backward is then
  essentially done) until the last bucket finished.
- compute_ms: dt_ms - exposed_ms.
- tokens_per_sec: tokens of all ranks in this step / dt.
- wait_ms (= exposed_ms) and share (sequences of the global batch this rank trained on; --balance moves it).
Warm-up steps (--timing-warmup-steps) are left out of the run's tokens/s and percentiles.
"""

from __future__ import annotations

import json
import math
import resource
import threading
import time
from pathlib import Path


class CommTimer:
    """Collects (launch, done, bytes) of every bucket's all-reduce in the current step."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reset()

    def reset(self):
        with self._lock:
            self.launches: list[float] = []
            self.dones: list[float] = []
            self.bytes = 0

    def launched(self, nbytes: int) -> float:
        t = time.perf_counter()
        with self._lock:
            self.launches.append(t)
            self.bytes += nbytes
        return t

    def add_bytes(self, nbytes: int):
        with self._lock:
            self.bytes += nbytes

    def done(self):
        t = time.perf_counter()
        with self._lock:
            self.dones.append(t)

    def step_stats(self) -> dict:
        with self._lock:
            if not self.launches or not self.dones:
                return {"allreduce_ms": 0.0, "exposed_ms": 0.0, "allreduce_bytes": self.bytes, "buckets": 0}
            end = max(self.dones)
            return {"allreduce_ms": (end - min(self.launches)) * 1e3,
                    "exposed_ms": max(0.0, end - max(self.launches)) * 1e3,
                    "allreduce_bytes": self.bytes, "buckets": len(self.launches)}



class JsonlWriter:
    """Append one JSON object per line, flushed each time (readable while the run goes on)."""

    def __init__(self, path: Path, keep_steps_upto: int | None = None):
        self.path = Path(path)
        if keep_steps_upto is not None and self.path.exists():
            # resume: drop the records after the checkpoint, the run re-does those steps
            lines = [ln for ln in self.path.read_text().splitlines() if ln.strip()]
            kept = [ln for ln in lines if _step_of(ln) is not None and _step_of(ln) <= keep_steps_upto]
            self.path.write_text("".join(ln + "\n" for ln in kept))
        elif keep_steps_upto is None and self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a", buffering=1)  # noqa: SIM115 (open for the whole run)

    def write(self, rec: dict):
        self._f.write(json.dumps(rec) + "\n")

    def close(self):
        self._f.close()


def _step_of(line: str):
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return None


def percentile(values, q: float):
    """Linear-interpolated percentile (q in 0..100); None for no values."""
    v = sorted(values)
    if not v:
        return None
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def fmt_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def progress_line(rec: dict, total_steps: int, eta_s: float | None) -> str:
    eta = fmt_duration(eta_s) if eta_s is not None else "?"
    # the mean over the ranks; between local-SGD syncs only rank 0's own is known
    loss = f"{rec['loss_mean']:.4f}" if "loss_mean" in rec else f"{rec['loss']:.4f} (rank 0)"
    val = f" | val {rec['val_loss']:.4f}" if "val_loss" in rec else ""
    return (f"step {rec['step']:5d}/{total_steps} | loss {loss}{val} | lr {rec['lr']:.2e} | "
            f"dt {rec['dt_ms']:7.1f} ms | tok/s {rec['tokens_per_sec']:9,.0f} | "
            f"allreduce {rec['allreduce_ms']:6.1f} ms | eta {eta}")


def summarize_steps(records: list[dict], warmup: int) -> dict:
    """Throughput and timing over this process's steps, leaving out its first `warmup` steps."""
    timed = records[warmup:] if len(records) > warmup else records[-1:]
    total_s = sum(r["dt_ms"] for r in timed) / 1e3
    tokens = sum(r["tokens"] for r in timed)
    ar = [r["allreduce_ms"] for r in timed]
    comp = [r["compute_ms"] for r in timed]
    return {
        "timed_steps": len(timed),
        "tokens_per_sec": tokens / total_s if total_s > 0 else None,
        "step_ms_p50": percentile([r["dt_ms"] for r in timed], 50),
        "compute_ms_p50": percentile(comp, 50),
        "allreduce_ms_p50": percentile(ar, 50),
        "allreduce_ms_p95": percentile(ar, 95),
        "exposed_ms_p50": percentile([r["exposed_ms"] for r in timed], 50),
        # the exposed all-reduce is where a rank waits for slower peers (its own transfer time included)
        "wait_ms_p50": percentile([r["exposed_ms"] for r in timed], 50),
        "allreduce_bytes_per_step": timed[-1]["allreduce_bytes"] if timed else 0,
        "comm_compute_ratio": (sum(ar) / sum(comp)) if timed and sum(comp) > 0 else None,
    }


def peak_rss_bytes() -> int:
    """This rank's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def eta_s(records: list[dict], steps_left: int) -> float:
    """Seconds left at the mean step time of the last 10 steps."""
    recent = records[-10:]
    return steps_left * sum(r["dt_ms"] for r in recent) / len(recent) / 1e3
