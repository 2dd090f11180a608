# ruff: noqa
# Shaped like pytorch/examples imagenet/main.py: the group is made on CPU too, but the model is wrapped in DDP
# only on the CUDA branch, so CPU ranks never average gradients.
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

use_accel = torch.accelerator.is_available()
device = torch.device("cuda" if use_accel else "cpu")
dist.init_process_group(backend="nccl" if use_accel else "gloo")
model = torch.nn.Linear(2, 2)
if not use_accel:
    print("using CPU, this will be slow")
elif device.type == "cuda":
    model = DDP(model.cuda(), device_ids=[0])
