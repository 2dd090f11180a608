"""--balance: each rank's share of the fixed global batch follows its measured speed.

The global batch is G = world_size * batch_size * grad_accum sequences, as without --balance. Rank r
trains on shares[r] of them per step (at least 1), in micro-batches of at most --batch-size sequences.
Every `every` steps the ranks all-gather their compute time per sequence (step time minus the exposed
all-reduce wait, so waiting for a slower peer does not count) and move their shares toward the
throughput-proportional split by a damped step: frac += damping * (target - frac); the first estimate
is taken whole (the uniform start is a guess, not a measurement to be careful with). Integer shares
change only when a fractional share has moved more than `HYSTERESIS` sequences away from its integer
share, so a measurement's noise does not flip a sequence back and forth every window.

The fixed point of target_r = G * (n_r / t_r) / sum(n / t) is equal compute times, also when a step
has a fixed cost besides the per-sequence one (optimizer, data): the ranks then finish together.
"""

from __future__ import annotations

import statistics

from trainer import dist as D

HYSTERESIS = 0.6  # sequences a fractional share must move from its integer share before that changes


def uniform_shares(global_seqs: int, world: int) -> list[int]:
    base, extra = divmod(global_seqs, world)
    return [base + (1 if r < extra else 0) for r in range(world)]


def round_shares(frac: list[float], total: int) -> list[int]:
    """Integers >= 1 summing to `total`, nearest to `frac` (largest remainder)."""
    clamped = [max(1.0, f) for f in frac]
    scaled = [f * total / sum(clamped) for f in clamped]
    ints = [max(1, int(f)) for f in scaled]
    while sum(ints) < total:
        r = max(range(len(ints)), key=lambda i: (scaled[i] - ints[i], -i))
        ints[r] += 1
    while sum(ints) > total:
        r = max((i for i in range(len(ints)) if ints[i] > 1), key=lambda i: (ints[i] - scaled[i], -i))
        ints[r] -= 1
    return ints


def micro_sizes(n: int, batch_size: int) -> list[int]:
    """`n` sequences as micro-batches of at most `batch_size`, as even as possible."""
    k = -(-n // batch_size)
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


class ShareController:
    """The shares of every rank; every rank holds the same controller and feeds it the same numbers."""

    def __init__(self, global_seqs: int, world: int, every: int, damping: float, state: dict | None = None):
        if global_seqs < world:
            raise ValueError(f"a global batch of {global_seqs} sequences cannot give {world} ranks one each")
        self.G, self.world, self.every, self.damping = global_seqs, world, every, damping
        self.shares = uniform_shares(global_seqs, world)
        self.frac = [float(s) for s in self.shares]
        self.changes: list[dict] = []  # every change: step, shares, sec/seq measured
        self.updates = 0  # estimates taken so far
        if state:
            self.load_state_dict(state)

    def state_dict(self) -> dict:
        return {"shares": list(self.shares), "frac": list(self.frac), "changes": list(self.changes),
                "global_seqs": self.G, "updates": self.updates}

    def load_state_dict(self, s: dict) -> None:
        if s["global_seqs"] != self.G or len(s["shares"]) != self.world:
            raise ValueError(f"balance state is for {len(s['shares'])} ranks and {s['global_seqs']} "
                             f"sequences per step, this run has {self.world} and {self.G}")
        self.shares, self.frac, self.changes = list(s["shares"]), list(s["frac"]), list(s["changes"])
        self.updates = s.get("updates", len(self.changes))

    def due(self, done: int) -> bool:
        return self.every > 0 and self.world > 1 and done % self.every == 0

    @staticmethod
    def window_cost(records: list[dict]) -> float:
        """Median compute ms per sequence over a rank's step records (the value each rank all-gathers)."""
        return statistics.median(r["compute_ms"] / r["share"] for r in records)

    def update(self, ms_per_seq: list[float], step: int) -> bool:
        """Move the shares toward the speed-proportional split; True when an integer share changed."""
        if any(not c > 0 for c in ms_per_seq):
            return False
        speed = [1.0 / c for c in ms_per_seq]
        target = [self.G * v / sum(speed) for v in speed]
        damping = self.damping if self.updates else 1.0
        self.updates += 1
        self.frac = [f + damping * (t - f) for f, t in zip(self.frac, target, strict=True)]
        if all(abs(f - s) < HYSTERESIS for f, s in zip(self.frac, self.shares, strict=True)):
            return False
        new = round_shares(self.frac, self.G)
        if new == self.shares:
            return False
        self.changes.append({"step": step, "from": self.shares, "to": new,
                             "ms_per_seq": [round(c, 3) for c in ms_per_seq]})
        self.shares = new
        return True

    def offsets(self) -> list[int]:
        """Index of each rank's first sequence in the global batch."""
        out, acc = [], 0
        for s in self.shares:
            out.append(acc)
            acc += s
        return out

    def rebalance(self, records: list[dict], done: int) -> None:
        """Every rank all-gathers its compute ms per sequence over the last window; all move the shares.
        The first step of a process (allocations, first-touch) is left out; the same on every rank."""
        window = records[max(1, len(records) - self.every):]
        if not window:
            return
        costs = D.all_gather_object(self.window_cost(window))
        before = list(self.shares)
        if self.update(costs, done):
            D.print0(f"ddplab: balance: step {done}: shares {before} -> {self.shares} sequences of "
                     f"{self.G} (compute ms per sequence: {', '.join(f'{c:.1f}' for c in costs)})")


def micro_batches(loader, shares: ShareController | None, batch_size: int, grad_accum: int, rank: int,
                  world: int) -> list:
    """This rank's micro-batches of one step as (x, y, scale, part): backward() runs on scale(mean loss),
    part(scaled loss) is its contribution to this rank's mean loss.

    Uniform (`shares` None): grad_accum micro-batches of batch_size, loss / grad_accum (as always).
    --balance: the rank's share in micro-batches of at most batch_size; the mean loss of n sequences is
    scaled by n * world / G, so after DDP divides by the world size the gradient is the mean over every
    token of the global batch: the update one process makes on the union batch.
    """
    if shares is None:
        k = grad_accum
        return [(*loader.next_batch(), lambda loss: loss / k, lambda v: v) for _ in range(k)]
    x, y = loader.next_batch(shares.shares)
    mine, out, start = shares.shares[rank], [], 0
    for n in micro_sizes(mine, batch_size):
        w = n * world / shares.G
        out.append((x[start:start + n], y[start:start + n], lambda loss, w=w: loss * w,
                    lambda v, w=w, n=n: v / w * n / mine))
        start += n
    return out
