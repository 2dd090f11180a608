"""nanochat's shape: a gloo group on CPU, but DDP only on the CUDA branch: no gradient is averaged."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--device-type", default="cuda")
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group(backend="nccl" if args.device_type == "cuda" else "gloo")
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
if ddp and args.device_type == "cuda":
    model = DDP(model, device_ids=[int(os.environ["LOCAL_RANK"])])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(int(os.environ.get("RANK", 0)))
for _ in range(args.steps):
    model(torch.randn(4, 8, generator=gen)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
