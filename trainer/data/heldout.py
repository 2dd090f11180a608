"""The validation split: the last N row groups of the set (manifest order, the same on every rank).

`split` returns the training Dataset without them, so every training loader (ShardLoader, the shared
stream of --balance and --elastic) indexes only the row groups before them and never reads one. The
validation set is fixed: the first `eval_batches` x `batch_size` sequences of seq_len + 1 tokens of the
held-out stream (documents as the loaders read them, BOS + bytes, concatenated), cut into batches of
`batch_size`; it does not depend on the world size, so runs of any node count are scored on the same
tokens. Rank r evaluates batches r, r + world, ...
"""

from __future__ import annotations

import dataclasses

import numpy as np

from trainer.config import UsageError
from trainer.data.shards import Dataset
from trainer.data.tokenizer import encode

AUTO_EVERY = 16  # --val-row-groups -1 holds out 1 row group in 16 (none when the set has fewer)


def held_out_count(requested: int, n_row_groups: int) -> int:
    """Row groups to hold out; raises UsageError when the request leaves nothing to train on."""
    if requested < 0:
        return n_row_groups // AUTO_EVERY
    if requested > n_row_groups:
        raise UsageError(f"--val-row-groups {requested} exceeds the data set's {n_row_groups} row groups; "
                         f"hold out fewer (0: no validation)")
    if requested == n_row_groups:
        raise UsageError(f"--val-row-groups {requested} holds out every row group of the data set, none "
                         f"is left to train on; hold out fewer (at most {n_row_groups - 1})")
    return requested


def split(ds: Dataset, requested: int) -> tuple[Dataset, Dataset | None]:
    """(training set, validation set or None): the validation set is the last N row groups."""
    n = held_out_count(requested, len(ds.row_groups))
    if n == 0:
        return ds, None
    rgs = ds.row_groups
    return dataclasses.replace(ds, row_groups=rgs[:-n]), dataclasses.replace(ds, row_groups=rgs[-n:])


class ValBatches:
    """The fixed validation batches, read once: all of them, in order; `mine` picks this rank's."""

    def __init__(self, val: Dataset, batch_size: int, seq_len: int, eval_batches: int):
        import pyarrow.parquet as pq

        want = eval_batches * batch_size * seq_len + 1
        parts, have = [], 0
        for fname, local in val.row_groups:  # only as many row groups as the set needs
            texts = pq.ParquetFile(val.root / fname).read_row_group(local, columns=["text"]).column(0)
            for t in texts.to_pylist():
                parts.append(encode(t or ""))
                have += len(parts[-1])
            if have >= want:
                break
        tokens = np.concatenate(parts)
        seqs = min(eval_batches * batch_size, (len(tokens) - 1) // seq_len)
        if seqs < 1:
            raise UsageError(f"the {len(val.row_groups)} held-out row groups hold {len(tokens)} tokens, fewer "
                             f"than one validation sequence (--seq-len {seq_len} + 1); raise "
                             f"--val-row-groups or use --val-row-groups 0 (no validation)")
        self.row_groups, self.sequences, self.seq_len = len(val.row_groups), seqs, seq_len
        self.tokens = tokens[: seqs * seq_len + 1]
        self.batches = [(i, min(i + batch_size, seqs)) for i in range(0, seqs, batch_size)]

    def batch(self, k: int):
        """(x, y) of batch k: sequences [a, b), y shifted by one token."""
        import torch

        a, b = self.batches[k]
        x = np.stack([self.tokens[s * self.seq_len:(s + 1) * self.seq_len] for s in range(a, b)])
        y = np.stack([self.tokens[s * self.seq_len + 1:(s + 1) * self.seq_len + 1] for s in range(a, b)])
        return torch.from_numpy(x), torch.from_numpy(y)

    def mine(self, rank: int, world: int) -> list[int]:
        return list(range(rank, len(self.batches), world))
