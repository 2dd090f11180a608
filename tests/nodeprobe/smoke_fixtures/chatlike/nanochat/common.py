"""Shaped like nanochat's compute_init (written for this test): the process group is created on CUDA only."""
import os

import torch
import torch.distributed as dist


def get_dist_info():
    if int(os.environ.get("RANK", -1)) != -1:
        return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    return False, 0, 0, 1


def compute_init(device_type="cuda"):
    torch.manual_seed(42)
    is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    if is_ddp_requested and device_type == "cuda":
        device = torch.device("cuda", ddp_local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
    else:
        device = torch.device(device_type)
    return is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size, device
