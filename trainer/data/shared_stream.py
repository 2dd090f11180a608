"""The loader for --balance: one token stream over every row group, cut per step by the ranks' shares.

Without --balance each rank strides its own row groups (trainer/data/loader.py). With --balance the ranks
take different numbers of sequences per step, so a fixed stride would run one rank's row groups out
before the other's. Here the data set is one stream (row groups 0, 1, ... in order, each document BOS +
bytes, as ShardLoader reads them); each step takes the next G*T tokens of it (G = global batch in
sequences, T = sequence length), and rank r reads sequences offsets[r] .. offsets[r] + shares[r] - 1 of
that step. Every token of an epoch is read once, by one rank; a rank opens only the row groups its slice
overlaps. One process with --batch-size G reads the same sequences (the union batch).

The position (epoch, token offset in the epoch) is the same on every rank: it is the resumable state.
Seeking needs each row group's token count; they are computed once at start from the text lengths.
"""

from __future__ import annotations

import bisect

import numpy as np

from trainer.data.shards import Dataset
from trainer.data.tokenizer import encode


def row_group_tokens(ds: Dataset) -> list[int]:
    """Tokens in each row group: per document BOS + its UTF-8 bytes."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    files: dict = {}
    out = []
    for fname, local in ds.row_groups:
        if fname not in files:
            files[fname] = pq.ParquetFile(ds.root / fname)
        col = files[fname].read_row_group(local, columns=["text"]).column(0)
        lengths = pc.binary_length(pc.fill_null(col, ""))
        out.append(int(pc.sum(lengths).as_py() or 0) + len(col))
    return out


class SharedStreamLoader:
    """This rank's sequences of each global batch, by share (see the module docstring)."""

    def __init__(self, ds: Dataset, rank: int, seq_len: int, state: dict | None = None):
        self.ds, self.rank, self.T = ds, rank, seq_len
        self.rg_tokens = row_group_tokens(ds)
        self.starts = np.concatenate([[0], np.cumsum(self.rg_tokens)]).tolist()
        self.total = self.starts[-1]
        self.epoch = self.offset = 0
        self.seen: set[int] = set()
        self._cache: dict[int, np.ndarray] = {}
        self._files: dict = {}
        if state:
            self.load_state_dict(state)

    def state_dict(self) -> dict:
        return {"mode": "shared_stream", "epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, s: dict) -> None:
        if s.get("mode") != "shared_stream":
            raise ValueError("checkpoint data position is not a --balance position; resume with the same "
                             "--balance setting")
        self.epoch, self.offset = s["epoch"], s["offset"]

    @property
    def row_group(self) -> int:
        """Global index of the row group the next global batch starts in."""
        return bisect.bisect_right(self.starts, self.offset) - 1

    def _tokens(self, k: int) -> np.ndarray:
        if k not in self._cache:
            import pyarrow.parquet as pq

            fname, local = self.ds.row_groups[k]
            if fname not in self._files:
                self._files[fname] = pq.ParquetFile(self.ds.root / fname)
            texts = self._files[fname].read_row_group(local, columns=["text"]).column(0).to_pylist()
            if len(self._cache) > 2:
                self._cache.clear()
            self._cache[k] = np.concatenate([encode(t or "") for t in texts])
            self.seen.add(k)
        return self._cache[k]

    def _read(self, start: int, n: int) -> np.ndarray:
        """`n` tokens from stream index `start` of the current epoch (wrapping into the next ones)."""
        parts, pos = [], start % self.total
        while n > 0:
            k = bisect.bisect_right(self.starts, pos) - 1
            arr = self._tokens(k)[pos - self.starts[k]:]
            parts.append(arr[:n])
            n -= len(parts[-1])
            pos = (self.starts[k + 1]) % self.total
        return np.concatenate(parts)

    def next_batch(self, shares: list[int]):
        """(x, y) of this rank's shares[rank] sequences; advances every rank's position by sum(shares)."""
        import torch

        first = sum(shares[: self.rank])
        n = shares[self.rank]
        buf = torch.from_numpy(self._read(self.offset + first * self.T, n * self.T + 1))
        advanced = self.offset + sum(shares) * self.T
        self.epoch += advanced // self.total
        self.offset = advanced % self.total
        return buf[:-1].view(n, self.T), buf[1:].view(n, self.T)
