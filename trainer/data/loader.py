"""The resumable loader: this rank's row groups (rank, rank+world, ...) as (x, y) batches of token ids.

Ranks read disjoint row groups that together cover the data set (nanochat's rank striding); the
position of the next unread token is the state a checkpoint stores.
"""

from __future__ import annotations

import numpy as np

from trainer.config import UsageError
from trainer.data.shards import Dataset
from trainer.data.tokenizer import encode


class ShardLoader:
    """Batches of (x, y) token ids for one rank, from row groups rank, rank+world, ...

    Each batch takes B*T+1 consecutive tokens of this rank's stream (x = first B*T, y = shifted by one);
    the next batch starts at the last token of this one. The position of the next unread token,
    (epoch, k = index into this rank's row groups, row, token), is the resumable state.
    """

    def __init__(self, ds: Dataset, rank: int, world_size: int, batch_size: int, seq_len: int,
                 state: dict | None = None):
        n = len(ds.row_groups)
        if world_size > n:
            raise UsageError(f"the data has {n} row groups but the world size is {world_size}, so some "
                             f"ranks would get no data; prepare more data or a smaller --rows-per-group "
                             f"(at least {world_size} row groups)")
        self.ds, self.rank, self.world = ds, rank, world_size
        self.B, self.T = batch_size, seq_len
        self.my_rgs = list(range(rank, n, world_size))
        self.epoch = self.k = self.row = self.tok = 0
        self.seen: set[int] = set()
        self._cache: dict[int, list[np.ndarray]] = {}
        self._files: dict = {}
        if state:
            self.load_state_dict(state)

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "k": self.k, "row": self.row, "tok": self.tok, "rank": self.rank,
                "world_size": self.world}

    def load_state_dict(self, s: dict):
        if s["world_size"] != self.world or s["rank"] != self.rank:
            raise UsageError(f"checkpoint data position is for rank {s['rank']} of {s['world_size']}, this "
                             f"is rank {self.rank} of {self.world}; resume with the same number of ranks")
        self.epoch, self.k, self.row, self.tok = s["epoch"], s["k"], s["row"], s["tok"]

    @property
    def row_group(self) -> int:
        """Global index of the row group the next batch starts in."""
        return self.my_rgs[self.k]

    def _docs(self, k: int) -> list[np.ndarray]:
        if k not in self._cache:
            import pyarrow.parquet as pq

            fname, local = self.ds.row_groups[self.my_rgs[k]]
            if fname not in self._files:
                self._files[fname] = pq.ParquetFile(self.ds.root / fname)
            texts = self._files[fname].read_row_group(local, columns=["text"]).column(0).to_pylist()
            if len(self._cache) > 2:
                self._cache.clear()
            self._cache[k] = [encode(t or "") for t in texts]
            self.seen.add(self.my_rgs[k])
        return self._cache[k]

    def _walk(self, epoch, k, row, tok):
        """Yield (array slice, position after it) from a position onwards, forever (epochs wrap)."""
        while True:
            docs = self._docs(k)
            while row < len(docs):
                yield docs[row][tok:], (epoch, k, row + 1, 0)
                row, tok = row + 1, 0
            k, row = k + 1, 0
            if k == len(self.my_rgs):
                epoch, k = epoch + 1, 0

    def next_batch(self):
        import torch

        need, step = self.B * self.T + 1, self.B * self.T
        parts, have, new_pos = [], 0, None
        pos = (self.epoch, self.k, self.row, self.tok)
        for arr, after in self._walk(*pos):
            if new_pos is None and have + len(arr) > step:
                e, k, r, _ = pos
                new_pos = (e, k, r, pos[3] + (step - have))
            parts.append(arr[: need - have])
            have += len(parts[-1])
            if have >= need:
                break
            pos = after
        self.epoch, self.k, self.row, self.tok = new_pos
        buf = torch.from_numpy(np.concatenate(parts))
        return buf[:-1].view(self.B, self.T), buf[1:].view(self.B, self.T)
