"""Run nodeprobe commands as the nodes do: a subprocess with the repo's python, bounded in time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def probe(*args: str, timeout: float = 60, cwd: Path = REPO) -> dict:
    """`python -m nodeprobe ARGS`: exit 0 and exactly one JSON object on stdout."""
    out = subprocess.run([sys.executable, "-m", "nodeprobe", *args], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd)
    assert out.returncode == 0, f"nodeprobe {args} exit {out.returncode}: {out.stderr[-2000:]}"
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, f"expected one JSON line, got: {out.stdout!r}"
    return json.loads(lines[0])


def popen_probe(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "nodeprobe", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
