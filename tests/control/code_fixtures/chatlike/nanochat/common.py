# ruff: noqa
# Shaped like nanochat (compute_init, DistAdamW, -m scripts.base_train), cut to what ddplab's code check reads.
import os
import torch
import torch.distributed as dist

def get_dist_info():
    if all(v in os.environ for v in ("RANK", "LOCAL_RANK", "WORLD_SIZE")):
        return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    return False, 0, 0, 1

def autodetect_device_type():
    return "cuda" if torch.cuda.is_available() else "cpu"

def compute_init(device_type="cuda"):
    assert device_type in ["cuda", "mps", "cpu"]
    if device_type == "cuda":
        assert torch.cuda.is_available()
        torch.cuda.manual_seed(42)
    is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size = get_dist_info()
    if is_ddp_requested and device_type == "cuda":
        device = torch.device("cuda", ddp_local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group(backend="nccl", device_id=device)
        dist.barrier()
    else:
        device = torch.device(device_type)
    return is_ddp_requested, ddp_rank, ddp_local_rank, ddp_world_size, device

def compute_cleanup():
    if dist.is_initialized():
        dist.destroy_process_group()
