# ruff: noqa
# build-nanogpt train_gpt2.py:293 and modded-nanogpt train_gpt.py:59.
import torch
import torch.distributed as dist

ddp = True
if ddp:
    assert torch.cuda.is_available(), "for now i think we need CUDA for DDP"
    dist.init_process_group(backend="gloo")
