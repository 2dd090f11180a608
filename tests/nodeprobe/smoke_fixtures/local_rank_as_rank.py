"""Takes LOCAL_RANK for the global rank: trains on one node (there the two agree); on two nodes the first
rank of each claims rank 0 and the group never forms."""
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group(backend="gloo", rank=local_rank, world_size=int(os.environ["WORLD_SIZE"]))
torch.manual_seed(0)
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(100 + local_rank)
for _ in range(3):
    loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
