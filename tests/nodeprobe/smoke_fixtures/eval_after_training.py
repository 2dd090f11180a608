"""Trains on CPU over gloo as one DDP run, then evaluates on GPU 0 (`.to(0)`, as code written for one GPU
per rank does): the evaluation after the training loop fails on CPU nodes; a smoke run stopped after 2
optimizer steps never gets there."""
import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model) -> float:
    model.eval()
    batch = torch.randn(4, 8).to(0)
    with torch.no_grad():
        return model(batch).pow(2).mean().item()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=1000)
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + dist.get_rank())
    for _ in range(args.iters):
        loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    print("eval loss", evaluate(model))
    dist.destroy_process_group()


main()
