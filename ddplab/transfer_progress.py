"""Progress of a transfer as the operator reads it: bytes done/total, rate, ETA (pure functions, no I/O).

rsync ``--info=progress2`` prints its running byte count for the whole transfer, each update ending in a
carriage return (``"  536,870,912  50%  102.40MB/s    0:00:05 (xfr#4, to-chk=4/8)"``). ``rsync_bytes``
reads the count; ``Meter`` turns counts into a rate over the last few seconds (rsync's own rate is per
file) and the remaining time; ``line`` writes the one line the playbook shows per poll.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PROGRESS = re.compile(r"^\s*([\d,.]+)\s+\d+%")
WINDOW_S = 5.0
SHOW_NAMES = 3


def rsync_bytes(chunk: str) -> int | None:
    """The byte count of one progress2 update, or None when the chunk is something else."""
    m = PROGRESS.match(chunk)
    if not m:
        return None
    digits = re.sub(r"[,.]", "", m[1])  # the thousands separator follows the locale
    return int(digits) if digits.isdigit() else None


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


@dataclass
class Meter:
    total: int
    files: int
    names: list[str] = field(default_factory=list)  # the files' node paths, named in the final line
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds since start, bytes done)

    def add(self, t: float, done: int) -> None:
        self.samples.append((t, min(done, self.total)))
        while len(self.samples) > 2 and self.samples[-1][0] - self.samples[1][0] >= WINDOW_S:
            self.samples.pop(0)

    @property
    def done(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    @property
    def rate(self) -> float | None:
        """Bytes per second over the last WINDOW_S seconds (None before two samples)."""
        if len(self.samples) < 2 or self.samples[-1][0] <= self.samples[0][0]:
            return None
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return (b1 - b0) / (t1 - t0)

    @property
    def eta(self) -> float | None:
        rate = self.rate
        return (self.total - self.done) / rate if rate else None

    def state(self, elapsed: float, status: str = "running") -> dict:
        return {"state": status, "done": self.done, "total": self.total, "files": self.files,
                "rate": self.rate, "eta": self.eta, "elapsed": round(elapsed, 1),
                "line": line(status, self.done, self.total, self.files, self.rate, self.eta, elapsed,
                             self.names)}


def line(status: str, done: int, total: int, files: int, rate: float | None, eta: float | None,
         elapsed: float, names: list[str] | None = None) -> str:
    if status == "done":
        avg = f" ({size(total / elapsed)}/s)" if elapsed > 0 else ""
        named = sorted(names or [])
        more = " ..." if len(named) > SHOW_NAMES else ""
        which = f": {', '.join(named[:SHOW_NAMES])}{more}" if named else ""
        return f"sent {size(total)} in {elapsed:.1f} s{avg}, {files} file{'s' if files != 1 else ''}{which}"
    pct = 100 * done / total if total else 100.0
    shown_rate = f"{size(rate)}/s" if rate is not None else "-/s"
    shown_eta = duration(eta) if eta is not None else "-"
    return (f"{size(done)} / {size(total)} ({pct:.0f}%) of {files} files, {shown_rate}, ETA {shown_eta}, "
            f"{elapsed:.0f} s so far")
