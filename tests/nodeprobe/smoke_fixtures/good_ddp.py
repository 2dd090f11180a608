"""A CPU-correct DDP script: gloo group, DDP-wrapped model, each rank its own data; writes out/ckpt.pt."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
gen = torch.Generator().manual_seed(100 + rank)
for _ in range(5):
    x = torch.randn(4, 8, generator=gen)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
if rank == 0:
    os.makedirs("out", exist_ok=True)
    torch.save(model.module.state_dict(), "out/ckpt.pt")
dist.destroy_process_group()
