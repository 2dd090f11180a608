"""``python -m ddplab compile-ship < SPEC``: which nodes get the master's warm torch.compile caches, and why
not the others.

The smoke run compiled the code on the master (nodeprobe/compile_seed.py packs what it built); a node
whose ranks load it skips the compile at its first step. A compiled kernel is a shared library built with
``-march=native`` for the master's CPU against its torch and Python: a node loads it only when its torch
version, Python, machine, C library and CPU flags are the master's; the others compile on their own, and
the line says what differs.

SPEC::

    {"master": "node0", "seed": {"files": 12, "bytes": 345, "sha256": "..."},
     "nodes": {"node0": <fingerprint>, "node1": <fingerprint>, ...}}   # nodeprobe compile-seed fingerprint

``seed`` and each node's value may also be the text the node printed (``compile-seed pack``'s JSON, and
``compile-seed fingerprint``'s, whose ``fingerprint`` is read): roles/launch passes the answers as they came.

Prints ``{"ship": ["node0", "node1"], "lines": ["..."]}``: ``ship`` the nodes whose ranks get the seed (the
master too: its ranks' folders are not the smoke run's).
"""

from __future__ import annotations

import json
import sys

from ddplab.errors import DdplabError

FIELDS = (("torch", "torch"), ("python", "Python"), ("machine", "machine"), ("libc", "C library"))
SHOWN_FLAGS = 6


def mismatch(master: dict, node: dict) -> str:
    """What differs between the node's and the master's fingerprint ("" when nothing does)."""
    for key, label in FIELDS:
        if node.get(key) != master.get(key):
            return f"its {label} is {node.get(key) or 'missing'}, the master's {master.get(key) or 'missing'}"
    mine, theirs = set(node.get("cpu_flags") or []), set(master.get("cpu_flags") or [])
    if mine != theirs:
        lacks, extra = sorted(theirs - mine), sorted(mine - theirs)
        parts = []
        if lacks:
            parts.append(f"lacks the master's {', '.join(lacks[:SHOWN_FLAGS])}"
                         + (f" and {len(lacks) - SHOWN_FLAGS} more" if len(lacks) > SHOWN_FLAGS else ""))
        if extra:
            parts.append(f"has {', '.join(extra[:SHOWN_FLAGS])}"
                         + (f" and {len(extra) - SHOWN_FLAGS} more" if len(extra) > SHOWN_FLAGS else "")
                         + " the master lacks")
        return "its CPU " + " and ".join(parts) + " (kernels are built with -march=native)"
    return ""


def as_printed(spec: dict) -> dict:
    """The spec with the nodes' printed answers read (see SPEC)."""
    seed = spec.get("seed")
    nodes = {name: json.loads(v)["fingerprint"] if isinstance(v, str) else v
             for name, v in (spec.get("nodes") or {}).items()}
    return {**spec, "seed": json.loads(seed) if isinstance(seed, str) else seed, "nodes": nodes}


def decide(spec: dict) -> dict:
    master = spec["master"]
    nodes = spec.get("nodes") or {}
    seed = spec.get("seed") or {}
    if master not in nodes:
        raise DdplabError(f"no fingerprint of the master {master} in the spec")
    if not seed.get("files"):
        return {"ship": [], "lines": [
            "no torch.compile cache to ship: the smoke run on the master compiled nothing (the code does not "
            "use torch.compile, or its backend generates no code)"]}
    ship, lines = [], []
    for name in sorted(nodes):
        why = mismatch(nodes[master], nodes[name])
        if why:
            lines.append(f"{name} compiles on its own at its first step (the master's torch.compile cache "
                         f"cannot be used there: {why})")
        else:
            ship.append(name)
    mib = (seed.get("bytes") or 0) / (1 << 20)
    lines.insert(0, f"the master's torch.compile cache ({seed['files']} files, {mib:.1f} MiB, warmed by the "
                    f"smoke run) goes to {', '.join(ship) or 'no node'}: their ranks' first step loads it")
    return {"ship": ship, "lines": lines}


def cmd_compile_ship(args) -> int:
    text = sys.stdin.read()
    try:
        spec = as_printed(json.loads(text))
    except (ValueError, KeyError, TypeError):
        raise DdplabError(f"compile-ship: the spec on stdin is not JSON: {text.strip()[:200]!r}") from None
    print(json.dumps(decide(spec)))
    return 0


def add_parser(sub):
    p = sub.add_parser("compile-ship",
                       help="which nodes get the master's torch.compile cache (JSON on stdin)")
    p.set_defaults(func=cmd_compile_ship)
