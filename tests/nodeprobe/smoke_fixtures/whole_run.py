"""A CPU-correct DDP script with everything a real run does: training, an evaluation (its loss averaged
over the ranks), a checkpoint from rank 0, and --resume, which continues from that checkpoint."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def evaluate(model) -> float:
    model.eval()
    with torch.no_grad():
        loss = model(torch.randn(4, 8, generator=torch.Generator().manual_seed(7))).pow(2).mean()
    dist.all_reduce(loss, op=dist.ReduceOp.SUM)
    model.train()
    return loss.item() / dist.get_world_size()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=1000)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--out", default="out")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    dist.init_process_group(backend="gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    ckpt = os.path.join(args.out, "ckpt.pt")
    start = 0
    if args.resume:
        state = torch.load(ckpt, map_location="cpu")
        model.load_state_dict(state["model"])
        start = state["iter"]
    ddp = DDP(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(100 + rank)
    for it in range(start, start + args.iters):
        loss = ddp(torch.randn(4, 8, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (it + 1) % args.eval_every == 0:
            print(f"iter {it + 1}: val loss {evaluate(ddp):.4f}")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        torch.save({"model": model.state_dict(), "iter": start + args.iters}, ckpt)
    dist.destroy_process_group()


main()
