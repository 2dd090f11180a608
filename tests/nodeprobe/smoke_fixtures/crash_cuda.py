"""Asserts a GPU: every rank fails at once on a CPU node."""
import torch
import torch.distributed as dist


def setup():
    dist.init_process_group(backend="gloo")
    assert torch.cuda.is_available(), "this script needs a GPU"


setup()
