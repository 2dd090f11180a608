# ruff: noqa
# Shaped like pytorch/examples imagenet/main.py: the backend is an option whose default is nccl.
import argparse
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--dist-backend", default="nccl", type=str, help="distributed backend")
args = parser.parse_args()
dist.init_process_group(backend=args.dist_backend, init_method="env://")
