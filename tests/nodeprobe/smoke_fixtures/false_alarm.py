"""Trains correctly on CPU, but the static scan cannot see that the CUDA call is never reached there."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
if os.environ.get("ACCEL") == "1":  # never set on the nodes
    torch.cuda.set_device(dist.get_rank())
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
