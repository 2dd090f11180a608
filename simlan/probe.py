"""Small probes from the root namespace: does an sshd greet on port 22, a process's name, a log's tail."""

from __future__ import annotations

import socket
from pathlib import Path


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return " | ".join(text[-lines:]) or "(empty log)"


def ssh_answers(addr: str, timeout: float = 0.5) -> bool:
    """True when an SSH server greets us on addr:22."""
    try:
        with socket.create_connection((addr, 22), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(8).startswith(b"SSH-")
    except OSError:
        return False


