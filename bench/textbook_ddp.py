"""The plain textbook DDP loop, as tutorials write it, for the same GPT: the baseline for trainer_scaling.

    torchrun --nproc_per_node=2 bench/textbook_ddp.py --data DIR --steps 20 --depth 4 --json out.json

init_process_group("gloo"), DDP(model), AdamW, forward/backward/step; random crops of the byte stream
per rank; no gradient accumulation, no checks, no metrics beyond step time. Alone (no torchrun) it runs
the bare model, world size 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from trainer.data.tokenizer import VOCAB_SIZE, encode  # noqa: E402
from trainer.model import GPT, GPTConfig  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="steps left out of tokens/s")
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None, help="write the result here (rank 0)")
    a = p.parse_args()

    ddp = "RANK" in os.environ
    if ddp:
        dist.init_process_group("gloo")
    rank, world = (dist.get_rank(), dist.get_world_size()) if ddp else (0, 1)
    torch.set_num_threads(a.threads)

    files = sorted(Path(a.data).glob("*.parquet"))
    texts = [t for f in files for t in pq.read_table(f).column("text").to_pylist()]
    stream = torch.from_numpy(np.concatenate([encode(t) for t in texts]))
    g = torch.Generator().manual_seed(1000 + rank)

    def get_batch():
        ix = torch.randint(len(stream) - a.seq_len - 1, (a.batch_size,), generator=g)
        x = torch.stack([stream[i:i + a.seq_len] for i in ix])
        y = torch.stack([stream[i + 1:i + 1 + a.seq_len] for i in ix])
        return x, y

    torch.manual_seed(1337)
    width = a.depth * 64
    model = GPT(GPTConfig(vocab_size=VOCAB_SIZE, seq_len=a.seq_len, n_layer=a.depth, n_embd=width,
                          n_head=max(1, width // 64)))
    if ddp:
        model = DDP(model)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95))
    times, losses = [], []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        x, y = get_batch()
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    timed = times[a.warmup:]
    tps = a.batch_size * a.seq_len * world * len(timed) / sum(timed)
    if rank == 0:
        res = {"world_size": world, "tokens_per_sec": tps,
               "step_ms_p50": sorted(timed)[len(timed) // 2] * 1e3,
               "loss_first": losses[0], "loss_last": losses[-1]}
        print(json.dumps(res))
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=2))
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
