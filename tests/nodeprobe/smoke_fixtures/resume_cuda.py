"""Trains on CPU over gloo and saves a snapshot; a relaunch that finds it resumes with
map_location=f"cuda:{local_rank}" (as the DDP tutorial's multinode.py does), which fails on CPU nodes: the
resume path, never taken by a first run."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def load_snapshot(model, path: str, local_rank: int) -> int:
    snapshot = torch.load(path, map_location=f"cuda:{local_rank}")
    model.load_state_dict(snapshot["model"])
    return snapshot["epochs_run"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--snapshot", default="snapshot.pt")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    epochs_run = load_snapshot(model, args.snapshot, local_rank) if os.path.exists(args.snapshot) else 0
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for epoch in range(epochs_run, args.epochs):
        loss = ddp(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if dist.get_rank() == 0:
            torch.save({"model": model.state_dict(), "epochs_run": epoch + 1}, args.snapshot)
    dist.destroy_process_group()


main()
