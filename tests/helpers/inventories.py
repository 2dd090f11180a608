"""Checks on a simulated lab's inventory folder, which outlives the clusters written into it."""

from __future__ import annotations

from pathlib import Path


def require_clean_inventory(inv: Path) -> None:
    """The lab's inventory folder outlives clusters: a settings file a module left there (a
    group_vars/all/ddplab.yml with ddplab_scheduler: slurm, once) would change every later test."""
    own = {inv / "group_vars" / "all" / "simlan.yml"}
    extra = sorted(str(p.relative_to(inv)) for d in ("group_vars", "host_vars") for p in (inv / d).rglob("*")
                   if p.is_file() and p not in own)
    assert not extra, f"{inv} holds settings a test left behind (remove them in its fixture): {extra}"
