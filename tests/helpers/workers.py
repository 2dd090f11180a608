"""Parallel test workers (pytest-xdist): each worker gets a simlan lab of its own.

simlan reads SIMLAN_LAB once, at import, so this runs in conftest before simlan is imported. Worker
gwN uses lab N+1; lab 0 (the plain names and `inventory/simlan`) stays free for the README test, which
runs `python -m simlan up` and `-i inventory/simlan` exactly as a reader types them."""

from __future__ import annotations

import os

MAX_LAB = 9  # simlan's labs are 0-9 (simlan/network.py)


def worker_lab(worker: str | None) -> int | None:
    """The lab of xdist worker `worker` ("gw0" -> 1), or None outside xdist."""
    if not worker:
        return None
    index = int(worker.removeprefix("gw"))
    if index + 1 > MAX_LAB:
        raise SystemExit(f"tests: at most {MAX_LAB} parallel workers (one simlan lab each); got {worker}")
    return index + 1


def use_own_simlan_lab() -> None:
    lab = worker_lab(os.environ.get("PYTEST_XDIST_WORKER"))
    if lab is not None:
        os.environ["SIMLAN_LAB"] = str(lab)
