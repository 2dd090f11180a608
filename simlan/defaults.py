"""Paths and defaults shared by simlan's modules (one home for each)."""

from __future__ import annotations

from pathlib import Path

from simlan import network

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_INVENTORY = REPO_ROOT / "inventory" / ("simlan" if network.LAB == 0 else f"simlan{network.LAB}")
DEFAULT_SYN_RETRIES = 3  # kernel default 6 (~127 s before connect() gives up); 3 gives ~15 s
READY_TIMEOUT = 10.0
SSHD = "/usr/sbin/sshd"
