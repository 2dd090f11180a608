# ruff: noqa
# Shaped like pytorch/examples distributed/*: the rest of a function after an early return under a GPU count
# test runs on GPUs only. (A sys.exit() there is itself a finding: see caught/exits.)
import torch
import torch.distributed as dist

dist.init_process_group(backend="gloo")


def cuda_extras(rank):
    if torch.cuda.device_count() < 1:
        return
    torch.cuda.set_device(rank)
    torch.zeros(2).to(rank)


def more_extras():
    if not torch.accelerator.is_available():
        return
    torch.cuda.synchronize()


cuda_extras(0)
more_extras()
