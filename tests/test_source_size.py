"""No source file of ddplab's own code is longer than MAX_LINES: a file that grows past it holds more than one
concern and is split by concern (trainer/start.py out of trainer/train.py, the smoke run's launcher, judge,
rank record and shard check out of nodeprobe/code_smoke.py and nodeprobe/smoke_rank.py)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("ddplab", "nodeprobe", "trainer", "simlan")
MAX_LINES = 450


def test_no_source_file_is_longer_than_max_lines():
    lengths = {str(path.relative_to(REPO)): len(path.read_text().splitlines())
               for folder in SOURCES for path in sorted((REPO / folder).rglob("*.py"))
               if "__pycache__" not in path.parts}
    assert len(lengths) > 100  # the folders were found
    too_long = {path: n for path, n in lengths.items() if n > MAX_LINES}
    assert not too_long, f"split these by concern (at most {MAX_LINES} lines a file): {too_long}"
