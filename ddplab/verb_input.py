"""The text a control verb reads: a file, or standard input for "-"."""

from __future__ import annotations

import sys


def input_text(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    with open(name) as f:
        return f.read()
