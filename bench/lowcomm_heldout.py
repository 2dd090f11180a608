"""The low-communication study's loss (bench/lowcomm.py): each run's final model on sequences from the whole
held-out set.

The trainer's own evaluation scores the first --eval-batches x --batch-size sequences (128 here: 16K tokens,
on the standard library's source the start of one row group, a few files), which is cheap enough to run
ten times per run for the curve. A comparison at the 1 % level needs more: the study loads each run's last
checkpoint and scores it on SEQUENCES sequences spread evenly over all held-out row groups (of about 3,900
on the standard library's source, 256 documents), the same ones for every run; all 3,900 would take a
minute per run on this machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trainer.data import heldout  # noqa: E402
from trainer.data.shards import open_dataset  # noqa: E402
from trainer.data.tokenizer import VOCAB_SIZE  # noqa: E402
from trainer.model import GPT, GPTConfig  # noqa: E402

SEQUENCES = 1024  # 131K tokens at 128 a sequence: 8x the trainer's, from every held-out document
BATCH = 32  # sequences per forward pass: throughput only, the mean is over all of them


class Heldout:
    """SEQUENCES sequences spread evenly over the held-out row groups of the shard folder `data` (the
    trainer's split), as (x, y) batches."""

    def __init__(self, data: Path, seq_len: int):
        _, held = heldout.split(open_dataset(data), -1)
        every = heldout.ValBatches(held, BATCH, seq_len, eval_batches=10**9)  # all of them, in order
        self.available = every.sequences
        n = min(SEQUENCES, every.sequences)
        picks = [i * every.sequences // n for i in range(n)]  # evenly spaced, distinct
        self.sequences = len(picks)
        windows = [every.tokens[s * seq_len:(s + 1) * seq_len + 1] for s in picks]
        self.batches = [torch.from_numpy(np.stack(windows[i:i + BATCH]).astype(np.int64))
                        for i in range(0, len(windows), BATCH)]


def final_checkpoint(out: Path) -> Path | None:
    found = sorted((out / "ckpt").glob("step_*.pt"))
    return found[-1] if found else None


@torch.no_grad()
def final_val_loss(out: Path, held: Heldout) -> float:
    """The mean loss per token of the run in `out`'s last checkpoint over `held`'s sequences (fp32)."""
    state = torch.load(final_checkpoint(out), map_location="cpu", weights_only=False)
    c = state["config"]
    model = GPT(GPTConfig(vocab_size=VOCAB_SIZE, seq_len=c["seq_len"], n_layer=c["depth"], n_embd=c["n_embd"],
                          n_head=c["n_head"]))
    model.load_state_dict(state["model"])
    model.eval()
    total = count = 0.0
    for b in held.batches:
        x, y = b[:, :-1].contiguous(), b[:, 1:].contiguous()
        total += model(x, y).item() * y.numel()
        count += y.numel()
    return total / count
