# ruff: noqa
# Shaped like pytorch/examples distributed/ddp/example.py (exits when fewer than 2 GPUs) and build-nanogpt /
# modded-nanogpt (`assert torch.cuda.is_available()`): on CPU nodes every rank stops before training.
import sys
import torch
import torch.distributed as dist


def verify_min_gpu_count(min_gpus=2):
    return torch.accelerator.is_available() and torch.accelerator.device_count() >= min_gpus


def main():
    assert torch.cuda.is_available(), "for now i think we need CUDA for DDP"
    dist.init_process_group(backend="gloo")
    torch.cuda.set_device(0)


if __name__ == "__main__":
    if not verify_min_gpu_count(min_gpus=2):
        print("Unable to locate sufficient 2 gpus to run this example. Exiting.")
        sys.exit()
    if torch.cuda.device_count() < 2:
        raise SystemExit("needs 2 GPUs")
    main()
