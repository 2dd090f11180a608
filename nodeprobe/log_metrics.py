"""Progress and metrics read from a rank's own output: the lines your code prints into launch.log.

Code that writes no ddplab metrics (your own entry point) still prints its loss, step time and tokens/s.
This module finds those lines and turns them into records, for ``status.yml`` (the node reads the log's
first and last 64 KiB: cheap on every poll of a long log) and ``report.md`` (the whole collected log).

A *format* is a list of regexes with named groups (``FIELDS``). A line that matches with a ``step`` group
is a record; a match without one only sets the run-wide values (``CONTEXT``: the total steps, tokens per
step) that later records inherit. Built in:

- ``nanogpt``: train.py's ``iter 10: loss 2.3456, time 123.45ms, mfu 1.23%`` and ``step 250: train loss
  ..., val loss 2.2000``; the total from ``Overriding: max_iters = 200`` (configurator.py) or a config
  file's ``max_iters = 5000`` line it echoes; tokens per step from ``tokens per iteration will be: 12,288``.
- ``nanochat``: scripts/base_train.py's ``step 00001/00020 (5.00%) | loss: ... | dt: ...ms | tok/sec:
  1,234 | bf16_mfu: ...`` and ``Step 00010 | Validation bpb: 1.234``.
- ``ddplab``: the built-in trainer's progress line (trainer/metrics.py ``progress_line``: ``step 12/50 |
  loss ... | dt ... ms | tok/s 12,345 | allreduce 3.0 ms | eta ...``). Its status and report read its
  metrics files; ``ddplab tune`` reads this line, as it reads the others.

Choice: ``ddplab_log_pattern`` (one regex, ``custom``) when set; else the first built-in format whose
training line appears in the log; else none. Numbers may carry thousands separators (``1,234``,
``1_234``); a non-finite number (``nan``) reads as missing. Lines prefixed by torchrun (``[rank0]:``,
``[default0]:``) are read without the prefix; only the lines after launch.sh's last ``ddplab: run `` line
(this attempt) count; a last line without its newline (still being written) is left out.
Standard library only: it runs on the nodes (run-status) and on the control host (ddplab/report.py).
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass

from nodeprobe.rank_error import split_prefix

# The named groups a pattern may use: the type each is read as, and what it means (the settings doc).
FIELDS = {
    "step": (int, "the step the line reports (required)"),
    "total": (int, "the steps the run will make"),
    "loss": (float, "training loss"),
    "val_loss": (float, "validation loss"),
    "val_bpb": (float, "validation bits per byte"),
    "tokens_per_sec": (float, "tokens/s of the ranks that print the line"),
    "tokens_per_step": (float, "tokens per step (with dt_ms it gives tokens/s)"),
    "dt_ms": (float, "step time in ms"),
    "mfu": (float, "model FLOPs utilisation, %"),
    "allreduce_ms": (float, "time of the step's all-reduce in ms (its share of dt_ms: the communication)"),
}
CONTEXT = ("total", "tokens_per_step")  # printed once; every later record inherits them
REQUIRED = "step"
CUSTOM = "custom"
RUN_START = "ddplab: run "  # launch.sh's first line of each attempt
NUM = r"[-+]?(?:\d[\d,_]*(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
INT = r"\d[\d,_]*"
HEAD_BYTES = TAIL_BYTES = 65536


@dataclass(frozen=True)
class Format:
    name: str
    patterns: tuple  # compiled regexes; the first is the training line that identifies the format


def _format(name: str, *patterns: str) -> Format:
    return Format(name, tuple(re.compile(p) for p in patterns))


BUILTIN = (
    _format("nanogpt",
            rf"^iter (?P<step>\d+): loss (?P<loss>{NUM}), time (?P<dt_ms>{NUM})ms, mfu (?P<mfu>{NUM})%",
            rf"^step (?P<step>\d+): train loss {NUM}, val loss (?P<val_loss>{NUM})",
            rf"^tokens per iteration will be: (?P<tokens_per_step>{INT})\s*$",
            r"^(?:Overriding: )?max_iters\s*=\s*(?P<total>\d+)\s*(?:#.*)?$"),
    _format("nanochat",
            rf"^step (?P<step>\d+)/(?P<total>\d+) \({NUM}%\) \| loss: (?P<loss>{NUM}) \|.*? \| "
            rf"dt: (?P<dt_ms>{NUM})ms \| tok/sec: (?P<tokens_per_sec>{INT}) \| \w*mfu: (?P<mfu>{NUM})",
            rf"^Step (?P<step>\d+) \| Validation bpb: (?P<val_bpb>{NUM})"),
    _format("ddplab",
            rf"^step\s+(?P<step>\d+)/(?P<total>\d+) \| loss (?P<loss>{NUM})(?: \(rank 0\))?"
            rf"(?: \| val (?P<val_loss>{NUM}))? \| lr {NUM} \| dt\s+(?P<dt_ms>{NUM}) ms \| "
            rf"tok/s\s+(?P<tokens_per_sec>{INT}) \| allreduce\s+(?P<allreduce_ms>{NUM}) ms"),
)
BY_NAME = {f.name: f for f in BUILTIN}


class PatternError(ValueError):
    """A ddplab_log_pattern that cannot be used; the message says why and what is allowed."""


def custom_format(text: str) -> Format:
    """The user's regex as a format; PatternError when it does not compile or names unknown groups."""
    try:
        rx = re.compile(text)
    except re.error as e:
        raise PatternError(f"is not a Python regex ({e})") from None
    unknown = sorted(set(rx.groupindex) - set(FIELDS))
    if unknown:
        raise PatternError(f"has the unknown group name(s) {', '.join(unknown)}")
    if REQUIRED not in rx.groupindex:
        raise PatternError(f"has no (?P<{REQUIRED}>...) group")
    return Format(CUSTOM, (rx,))


def number(kind, text: str):
    """A field's value: separators dropped; None for a non-finite or unreadable number."""
    try:
        value = kind(float(text.replace(",", "").replace("_", "")))
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def this_attempt(lines: list[str]) -> list[str]:
    """The lines after launch.sh's last `ddplab: run ` line, without torchrun's rank prefixes."""
    starts = [i for i, ln in enumerate(lines) if ln.startswith(RUN_START)]
    return [split_prefix(ln)[1] for ln in lines[starts[-1] + 1 if starts else 0:]]


def choose(lines: list[str], pattern: str = "") -> Format | None:
    """The format to read: the setting's regex, else the first built-in whose training line appears."""
    if pattern:
        return custom_format(pattern)
    for fmt in BUILTIN:
        if any(fmt.patterns[0].search(ln) for ln in lines):
            return fmt
    return None


def parse(lines: list[str], fmt: Format) -> tuple[list[dict], dict]:
    """(records in log order, the run-wide context values). A record has `step` and the fields its line
    held, plus the context known by then; tokens_per_sec is derived from tokens_per_step and dt_ms
    when the line does not print it."""
    records, context = [], {}
    for line in lines:
        for rx in fmt.patterns:
            m = rx.search(line)
            if not m:
                continue
            found = {k: number(FIELDS[k][0], v) for k, v in m.groupdict().items() if v is not None}
            context.update({k: found[k] for k in CONTEXT if found.get(k) is not None})
            if found.get(REQUIRED) is not None:
                rec = {**context, **{k: v for k, v in found.items() if v is not None}}
                if "tokens_per_sec" not in rec and rec.get("tokens_per_step") and rec.get("dt_ms"):
                    rec["tokens_per_sec"] = rec["tokens_per_step"] / rec["dt_ms"] * 1000.0
                records.append(rec)
            break
    return records, context


def split_lines(text: str, *, partial_first: bool = False) -> list[str]:
    """Complete lines of a chunk: a last line without its newline is being written; a first line that
    starts mid-file (partial_first) is cut."""
    lines = text.split("\n")
    lines.pop()  # "" after a final newline, else the unfinished last line
    return lines[1:] if partial_first else lines


def read_lines(path: str, whole: bool = False) -> list[str]:
    """The log's lines: all of them (whole), else its first HEAD_BYTES (where the context is printed)
    and its last TAIL_BYTES (where the progress is). [] when it cannot be read."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if whole or size <= HEAD_BYTES + TAIL_BYTES:
                return split_lines(f.read().decode(errors="replace"))
            head = f.read(HEAD_BYTES).decode(errors="replace")
            f.seek(size - TAIL_BYTES)
            tail = f.read().decode(errors="replace")
    except OSError:
        return []
    return head.split("\n")[:-1] + split_lines(tail, partial_first=True)


def read_log(path: str, pattern: str = "", whole: bool = False) -> dict:
    """{"format", "records", "context"} of a rank's log ("format" None: no known line in it)."""
    lines = this_attempt(read_lines(path, whole))
    fmt = choose(lines, pattern)
    records, context = parse(lines, fmt) if fmt else ([], {})
    return {"format": fmt.name if fmt else None, "records": records, "context": context}


def last(records: list[dict], key: str):
    return next((r[key] for r in reversed(records) if r.get(key) is not None), None)


def timed(records: list[dict], key: str) -> list:
    """A field's values over the training records, the first (warm-up) left out when there are more."""
    values = [r[key] for r in records if r.get(key) is not None]
    return values[1:] if len(values) > 1 else values


def median(values: list):
    return statistics.median(values) if values else None


def progress(records: list[dict], context: dict, recent: int = 20) -> dict:
    """Where the run is: step, total, loss, tokens/s, and the seconds left (eta_s) from the median step
    time of the last `recent` steps when the total and the step time are known."""
    step = last(records, "step")
    total = last(records, "total") or context.get("total")
    dt = median(timed(records[-recent:], "dt_ms"))
    eta = max(0, total - step) * dt / 1000.0 if None not in (step, total, dt) else None
    return {"step": step, "total": total, "loss": last(records, "loss"),
            "tokens_per_sec": last(records, "tokens_per_sec"), "eta_s": eta}


def summary(records: list[dict]) -> dict:
    """One log's figures for the report: the last step number it printed (in the code's own count:
    nanochat's and nanoGPT's start at 0, so it is not the number of steps made), final loss, median tokens/s
    and step time over the steps after the first (warm-up), last validation figures."""
    return {"last_step": last(records, "step"), "final_loss": last(records, "loss"),
            "tokens_per_sec": median(timed(records, "tokens_per_sec")),
            "step_ms_p50": median(timed(records, "dt_ms")),
            "val_loss": last(records, "val_loss"), "val_bpb": last(records, "val_bpb")}


def fmt_duration(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"
