# ruff: noqa
# One line per pattern the check used to miss, modelled on: pytorch/examples ddp-tutorial-series (moving the
# model to an int ordinal, loading a snapshot onto cuda:N), modded-nanogpt (the triton import, the mixed
# cuda/cpu backend string bound to a CUDA device_id), nanochat (device_id), and torch spelled through aliases.
import os
import torch as th
import torch.distributed as dist
from torch import cuda
import torch.cuda as tcuda
import triton
from comm import pick_backend

sync = th.cuda.synchronize
local_rank = int(os.environ["LOCAL_RANK"])
device = th.device("cuda", local_rank)
dist.init_process_group(backend="cuda:nccl,cpu:gloo", device_id=device)
dist.init_process_group(backend=pick_backend())


class Trainer:
    def __init__(self, model):
        self.gpu_id = int(os.environ["LOCAL_RANK"])
        self.model = model.to(self.gpu_id)
        x = th.zeros(2).to(0)
        y = th.zeros(2).to(local_rank)
        loc = f"cuda:{self.gpu_id}"
        state = th.load("snapshot.pt", map_location=loc)
        cuda.synchronize()
        tcuda.set_device(local_rank)
        th.cuda.current_device()


Trainer(th.nn.Linear(2, 2))
sync()
