"""Why a rank failed, in one line, from its launch.log: the exception its Python code raised.

torchrun's log of a failed rank holds the worker's traceback (each line prefixed `[rank0]:` once the
process group exists), then torchrun's own `ChildFailedError` traceback and its "Root Cause" block, whose
`traceback :` field holds the worker's traceback when the code uses `@record`, or `Signal 9 (SIGKILL)
received by PID ...` when the rank was killed. `exception_line(lines)` returns, in this order: the root
cause block's exception or signal, else the earliest rank's last exception (a chained one ends with the
exception that escaped), else a C++ `what():` line (gloo aborting); with the place it was raised when a
frame names it (`FileNotFoundError: ... 'configurator.py' (train.py:3)`). None when there is no exception
(the code called sys.exit with a code). Only the lines after launch.sh's last `ddplab: run ` line (this
attempt) are read. Standard library only (it runs on the nodes).
"""

from __future__ import annotations

import os
import re

PREFIX = re.compile(r"^\[(?:rank\d+|[A-Za-z_]+\d+)\]:\s?")  # [rank0]:, and torchrun --tee's [default0]:
FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+)')
HEADER = "Traceback (most recent call last):"
ROOT_FIELD = re.compile(r"^(\s*)traceback\s*:\s?(.*)$")
WRAPPER = "ChildFailedError"  # torchrun's own exception: it only says that a child failed


def split_prefix(line: str) -> tuple[str, str]:
    """('[rank1]:', rest) for a line of a rank's stream, ('', line) for torchrun's and launch.sh's lines."""
    m = PREFIX.match(line)
    return (m.group(0).strip(), line[m.end():]) if m else ("", line)


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def exception_after(lines: list[str], start: int, base: int) -> tuple[int, str] | None:
    """The exception line closing a traceback whose header is indented `base`: the first line after the
    frames that is not indented deeper, with the last frame's file:line appended."""
    where = ""
    for j in range(start, len(lines)):
        text = lines[j]
        if not text.strip():
            continue
        frame = FRAME.match(text)
        if frame:
            where = f"{os.path.basename(frame.group(1))}:{frame.group(2)}"
            continue
        if indent(text) <= base:
            message = text.strip()
            return j, (f"{message} ({where})" if where and not message.startswith("Signal ") else message)
    return None


def root_cause(lines: list[str]) -> str | None:
    """The exception (or signal) in torchrun's last "Root Cause" block."""
    found = None
    for i, text in enumerate(lines):
        m = ROOT_FIELD.match(text)
        if not m:
            continue
        rest = m.group(2).strip()
        if rest.startswith(HEADER):
            hit = exception_after(lines, i + 1, len(m.group(1)))
            found = hit[1] if hit else found
        elif rest.startswith("Signal "):
            found = rest
    return found


def stream_exceptions(lines: list[str]) -> list[tuple[int, str]]:
    """Per stream (a rank's prefixed lines, or the unprefixed ones): the last exception it printed, as
    (line index, text); torchrun's ChildFailedError is left out."""
    streams: dict[str, list[tuple[int, str]]] = {}
    for i, raw in enumerate(lines):
        key, text = split_prefix(raw)
        streams.setdefault(key, []).append((i, text))
    out = []
    for entries in streams.values():
        texts = [t for _, t in entries]
        last = None
        for k, text in enumerate(texts):
            if text.strip() == HEADER:
                hit = exception_after(texts, k + 1, indent(text))
                if hit and WRAPPER not in hit[1]:
                    last = (entries[hit[0]][0], hit[1])
        if last:
            out.append(last)
    return out


def exception_line(lines: list[str]) -> str | None:
    """The one line that says why the rank failed (see the module docstring), or None."""
    starts = [i for i, ln in enumerate(lines) if ln.startswith("ddplab: run ")]
    lines = lines[starts[-1] + 1:] if starts else list(lines)
    cause = root_cause(lines)
    if cause:
        return cause
    found = stream_exceptions(lines)
    if found:
        return min(found)[1]
    what = [split_prefix(ln)[1].strip() for ln in lines if "what():" in ln]
    return what[-1] if what else None


def log_exception(path: str, max_bytes: int = 262144) -> str | None:
    """exception_line of the end of a log file; None when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    line = exception_line(text.splitlines())
    return line[:300] if line else None
