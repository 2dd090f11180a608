"""FSDP2 on the blocks only: fully_shard(model) forgotten, so the embedding and the head stay plain
tensors on every rank, their gradients never averaged. The blocks' shards are fine; the rest differs."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group(backend="gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 32))
for block in model[1:3]:
    fully_shard(block)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
gen = torch.Generator().manual_seed(1 + dist.get_rank())
for _ in range(3):
    x = torch.randint(0, 32, (4, 8), generator=gen)
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 32), x.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
