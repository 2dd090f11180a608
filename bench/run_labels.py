"""The scaling lab's run labels (bench/scaling_lab.py's --comms, bench/docs_tables.py's rows): a --comm option
or local<H>[-bf16][-avg][-ovl][-f<F>][-qsr|-invlr], and the trainer flags each stands for."""

from __future__ import annotations

import re

# the low-communication mode's run labels
LOCAL = re.compile(r"local(\d+)(-bf16)?(-avg)?(-ovl)?(?:-f(\d+))?(?:-(qsr|invlr))?")
SCHEDULES = {"qsr": "qsr", "invlr": "inverse-lr"}  # a label's suffix: its --sync-schedule


def comm_flags(comm: str) -> list[str]:
    """A run's way of synchronizing: a --comm option, or local<H>[-bf16][-avg][-ovl][-f<F>][-qsr|-invlr]: the
    low-communication mode (DiLoCo, a parameter sync every H steps; -bf16: the sync sends 16-bit deltas;
    -avg: plain averaging, outer lr 1 and no momentum; -ovl: the sync runs under the next steps,
    --sync-overlap; -f<F>: in F fragments, one every H/F steps, --sync-fragments; -qsr, -invlr: the period
    stretched as the learning rate decays, --sync-schedule qsr or inverse-lr)."""
    m = LOCAL.fullmatch(comm)
    if m:
        return (["--comm", "bf16" if m.group(2) else "fp32", "--sync-every", m.group(1), "--allow-local-sgd"]
                + (["--outer-lr", "1", "--outer-momentum", "0"] if m.group(3) else [])
                + (["--sync-overlap"] if m.group(4) else [])
                + (["--sync-fragments", m.group(5)] if m.group(5) else [])
                + (["--sync-schedule", SCHEDULES[m.group(6)]] if m.group(6) else []))
    return ["--comm", comm]
