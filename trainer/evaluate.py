"""The validation loss on the held-out row groups (trainer/data/heldout.py), at equal token counts.

Every rank scores its part of the fixed validation batches with model.eval() and no gradients; the loss
sum and the token count are all-reduced, so every rank gets the mean over the whole set. Evaluation is
due when the run's global token count crosses a multiple of --eval-every-tokens, so runs with other node
counts or modes are compared at the same tokens, and at the last step. With --sync-every > 1 the ranks
hold different parameters between syncs: the evaluation waits for the next sync and records the tokens
seen then. The curve ([tokens, loss], ...) travels in checkpoints, so a resumed run keeps its points.
"""

from __future__ import annotations

import time

import torch

from trainer import dist as D
from trainer.data.heldout import ValBatches
from trainer.device import autocast_context
from trainer.local_sgd import crossed


class Evaluator:
    def __init__(self, data: ValBatches | None, every: int, rank: int, world: int, lockstep: bool = False):
        self.data, self.every = data, every
        self.mine = self.data.mine(rank, world) if self.data else []
        # --shard: every forward all-gathers with every rank, so all ranks run as many forwards (a rank with
        # fewer batches of its own repeats one and does not count it)
        self.forwards = -(-len(self.data.batches) // world) if self.data and lockstep else len(self.mine)
        self.curve: list[list[float]] = []

    @property
    def enabled(self) -> bool:
        return self.data is not None

    def due(self, tokens_before: int, tokens_now: int, last: bool) -> bool:
        """Tokens seen at the last sync and now; call only where the ranks hold the same parameters."""
        return self.enabled and (last or crossed(self.every, tokens_before, tokens_now))

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: str, dtype: str, tokens: int) -> dict:
        """Every rank: the mean validation loss over the whole set; appended to the curve."""
        t0 = time.perf_counter()
        was_training = model.training
        model.eval()
        acc = torch.zeros(2, dtype=torch.float64)  # loss sum, token count
        for i in range(self.forwards):
            x, y = self.data.batch(self.mine[i] if i < len(self.mine) else 0)
            with autocast_context(device, dtype):
                loss = model(x.to(device), y.to(device))
            if i < len(self.mine):
                acc[0] += loss.item() * y.numel()
                acc[1] += y.numel()
        model.train(was_training)
        D.all_reduce_sum(acc)  # every rank, also one without batches of its own
        val = float(acc[0] / acc[1])
        self.curve.append([tokens, val])
        return {"val_loss": val, "eval_ms": (time.perf_counter() - t0) * 1e3}

    def state_dict(self) -> dict:
        return {"curve": [list(p) for p in self.curve]}

    def load_state_dict(self, s: dict | None) -> None:
        self.curve = [list(p) for p in (s or {}).get("curve", [])]
