"""Runs that fail loudly: name the peer a rank lost, and warn when one rank is much slower than the rest.

- `lost_peer_line(exc, me, peers)`: the one line a rank prints when a collective failed because a peer
  went away (gloo: "Connection reset/closed by peer [ADDR]:PORT", or "Timed out waiting ..." when the
  peer fell silent). The peer is named from the address in gloo's message, matched against the
  hosts and addresses every rank reported at start; with two ranks it is simply the other one.
- `StragglerWatch`: every `every` steps the ranks all-gather the median of their own compute time
  (step time minus the exposed all-reduce wait, so waiting for a slow peer does not count); a rank
  whose median is `ratio` times the median of the others gets one warning line (and one line when it
  recovers). With --balance the compute times compared are per sequence, scaled to a uniform share (a
  balanced slow rank computes as long as the others, but is still slow), and the line says which share
  balancing gave it; without --balance it says that --balance would.
"""

from __future__ import annotations

import re
import statistics

import torch.distributed as dist

from trainer import dist as D
from trainer.straggler_rule import stragglers

# torch's wrappers around a gloo error in a DDP hook: "Got the following error when running the callback: "
_WRAPPER = re.compile(r"^(?:Got the following error when running the callback: )?(?:RuntimeError: )?")
_ADDR = re.compile(r"\[(?:::ffff:)?([0-9A-Fa-f.:]+)\]:\d+")
_COMM_WORDS = ("gloo", "Connection reset", "Connection closed", "Connection refused", "Broken pipe",
               "Timed out", "timed out", "wait timeout", "timeout after", "No route to host", "Socket")


def is_comm_failure(exc: BaseException) -> bool:
    """A failed collective or store operation (the peer died, hung, or the network went away)."""
    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _COMM_WORDS)


def short_reason(exc: BaseException) -> str:
    """gloo's own words, without torch's callback wrappers, source path and 'GLHF' advice."""
    text = str(exc).strip()
    while True:  # "Got the following error when running the callback: RuntimeError: ..." nests
        inner = _WRAPPER.sub("", text, count=1)
        if inner == text:
            break
        text = inner
    text = text.splitlines()[0] if text else type(exc).__name__
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically caused")[0].strip()


def lost_peer_line(exc: BaseException, me: int, peers: list[dict], master: str = "") -> str:
    """`lost peer rank R (HOST ADDR): <gloo message>; see its log` (peers: rank, host, addr)."""
    reason = short_reason(exc)
    if not peers:  # failed before the ranks exchanged their hosts (process-group setup)
        where = f" (master {master})" if master else ""
        return (f"lost contact with the other ranks during setup{where}: {reason}; check that every "
                f"node started its rank and see their logs")
    others = [p for p in peers if p["rank"] != me]
    mine = next((p["addr"] for p in peers if p["rank"] == me), None)
    named = [a for a in _ADDR.findall(reason) if a != mine]
    suspects = [p for p in others if p["addr"] in named] if named else []
    if not suspects and len(others) == 1:
        suspects = others
    who = ", ".join(f"rank {p['rank']} ({p['host']} {p['addr']})" for p in suspects)
    if len(suspects) == 1:
        return f"lost peer {who}: {reason}; see its log"
    if suspects:
        return f"lost a peer, one of {who}: {reason}; see their logs"
    listed = ", ".join(f"rank {p['rank']} ({p['host']} {p['addr']})" for p in others)
    return f"lost a peer, one of {listed}: {reason}; see their logs"


class StragglerWatch:
    """Collective every `every` steps (all ranks call `after_step` with the same step numbers)."""

    def __init__(self, every: int, ratio: float, world_size: int, hosts: list[str], log=D.print0,
                 shares=None):
        self.every, self.ratio, self.world_size, self.hosts, self.log = every, ratio, world_size, hosts, log
        self.shares = shares  # trainer.balance.ShareController with --balance, else None
        self.slow: dict[int, float] = {}
        self.warnings: list[str] = []

    def after_step(self, done: int, records: list[dict]) -> None:
        if self.every <= 0 or self.world_size < 2 or done % self.every or not records:
            return
        uniform = self.shares.G / self.world_size if self.shares else None
        window = [r["compute_ms"] * (uniform / r["share"] if uniform else 1) for r in records[-self.every:]]
        medians = D.all_gather_object(statistics.median(window))
        slow = stragglers(medians, self.ratio)
        for r in sorted(slow.keys() - self.slow.keys()):
            base = statistics.median([m for i, m in enumerate(medians) if i != r])
            per = " at a uniform share" if uniform else ""
            line = (f"ddplab: warning: straggler: rank {r} on {self.hosts[r]} computes {medians[r]:.0f} "
                    f"ms/step{per}, {slow[r]:.1f}x the others' {base:.0f} ms (steps {done - len(window) + 1}-"
                    f"{done}); {self.what_balancing_does(r)}")
            self.warnings.append(line)
            self.log(line)
        for r in sorted(self.slow.keys() - slow.keys()):
            self.log(f"ddplab: rank {r} on {self.hosts[r]} is no longer a straggler (step {done})")
        self.slow = slow

    def what_balancing_does(self, r: int) -> str:
        if self.shares is None:
            return ("every rank waits for it (check that node's load, thermals, power saving; --balance, "
                    "ddplab_balance: true, gives it a smaller share of the batch)")
        s = self.shares
        return (f"--balance gives it {s.shares[r]} of {s.G} sequences per step (uniform: "
                f"{s.G / self.world_size:g}; shares {s.shares}, re-estimated every {s.every} steps), so the "
                f"others wait less for it")
