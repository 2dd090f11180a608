# ruff: noqa
# A function called only on the CUDA branch: its CUDA calls are guarded by its callers.
import torch
import torch.distributed as dist

device_type = "cuda" if torch.cuda.is_available() else "cpu"


def setup_cuda(local_rank):
    torch.cuda.set_device(local_rank)
    torch.cuda.reset_peak_memory_stats()


if device_type == "cuda":
    setup_cuda(0)
dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
