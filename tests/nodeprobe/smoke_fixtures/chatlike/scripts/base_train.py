"""Shaped like nanochat's scripts/base_train.py (written for this test), run as -m scripts.base_train."""
import argparse

import torch
from nanochat.common import compute_init
from nanochat.optim import DistSGD

parser = argparse.ArgumentParser()
parser.add_argument("--device-type", default="cuda")
parser.add_argument("--num-iterations", type=int, default=4)
args = parser.parse_args()
ddp, ddp_rank, ddp_local_rank, ddp_world_size, device = compute_init(args.device_type)
model = torch.nn.Linear(8, 4).to(device)
optimizer = DistSGD(model.parameters(), lr=0.1)
for _ in range(args.num_iterations):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    optimizer.step()
    model.zero_grad(set_to_none=True)
