"""A small DDP model under torch.compile (inductor: C++ kernels built with the host's compiler, loaded as
shared libraries from TORCHINDUCTOR_CACHE_DIR); prints where this rank's compile cache and temp folder are."""
import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group(backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
model = DDP(torch.compile(net, backend="inductor"))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(100 + rank)
for _ in range(3):
    loss = model(torch.randn(4, 8, generator=gen)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"rank {rank} compile cache {os.environ.get('TORCHINDUCTOR_CACHE_DIR')} tmp {tempfile.gettempdir()}",
      flush=True)
dist.destroy_process_group()
