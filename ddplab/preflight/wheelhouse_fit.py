"""Does the control host's wheelhouse hold a torch for an unprepared node's Python? A node that was never
prepared (a new laptop, another Debian release) says its python3's version and machine when preflight finds
no lab Python there (roles/preflight/vars/main.yml); when the wheelhouse (make wheelhouse) was filled for
other Pythons only, prepare would refuse that node, so preflight names it with the command that fills it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ddplab.wheelhouse import MANIFEST, target

NODE_PYTHON = re.compile(r"its python3: (3\.\d+) (\S+?)\)")


def served(manifest: dict, python: str, machine: str) -> bool:
    """The wheelhouse's torch download covered this Python and machine (`make wheelhouse` records each)."""
    names = (manifest.get("torch_wheels") or {}).get(target(python, machine)) or []
    return any(n.startswith("torch-") for n in names)


def missing_wheel(reason: str, wheelhouse_dir: str | None) -> tuple[str, str] | None:
    """(what, fix) when the node's python3 (named in `reason`) has no torch in the wheelhouse; None when the
    reason names no Python, there is no wheelhouse (prepare then says what to do) or it serves this one."""
    m = NODE_PYTHON.search(reason)
    if not m or not wheelhouse_dir:
        return None
    try:
        manifest = json.loads((Path(wheelhouse_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    python, machine = m.groups()
    if served(manifest, python, machine):
        return None
    have = ", ".join(sorted(manifest.get("torch_wheels") or {})) or "none"
    return (f"its python {python} {machine} has no torch {manifest.get('torch', '')} wheel in "
            f"{wheelhouse_dir} (filled for: {have})",
            f'make wheelhouse PYTHONS="{python}"  # then run playbooks/prepare.yml')
