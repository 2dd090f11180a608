"""What stays visible inside a root host's private home and /tmp: the Python installs in use and the
repository (see "Private home" in simlan/README.md)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from simlan.defaults import REPO_ROOT


def venv_python() -> str:
    """The Python running simlan, as its venv path (.venv/bin/python), not the interpreter it links to."""
    if sys.prefix != sys.base_prefix:
        for name in ("python", "python3"):
            candidate = Path(sys.prefix, "bin", name)
            if candidate.exists():
                return str(candidate)
    return sys.executable


def keep_paths(real_home: str, python: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Top-level entries of the real home (or of /tmp, which is private too: a checkout in /tmp) that
    must stay visible in the host: those holding the Python installs in use (e.g. /root/.pyenv), the
    repository, and `extra`."""
    return _tops(real_home, python, extra)


def keep_tmp_paths(python: str, extra: tuple[str, ...] = ()) -> list[str]:
    return _tops("/tmp", python, extra)


def _tops(root: str, python: str, extra: tuple[str, ...]) -> list[str]:
    home = Path(root).resolve()
    candidates = [sys.base_prefix, sys.prefix, sys.executable, python, os.path.realpath(python),
                  str(REPO_ROOT), *extra]
    keep: list[str] = []
    for cand in candidates:
        real = Path(os.path.realpath(cand))
        try:
            rel = real.relative_to(home)
        except ValueError:
            continue  # outside the home: visible anyway
        if rel.parts and str(home / rel.parts[0]) not in keep:
            keep.append(str(home / rel.parts[0]))
    return keep


