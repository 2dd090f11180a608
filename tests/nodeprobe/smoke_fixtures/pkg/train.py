"""The good script as a module (-m pkg.train), with arguments and an environment variable it reads."""
import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
args = parser.parse_args()
assert os.environ["SMOKE_FIXTURE_VAR"] == "set", "ddplab_env did not reach the rank"
dist.init_process_group(backend="gloo")
model = DDP(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(args.steps):
    model(torch.randn(4, 8)).pow(2).mean().backward()
    opt.step()
    opt.zero_grad()
os.makedirs(os.environ["OUT_DIR"], exist_ok=True)
with open(os.path.join(os.environ["OUT_DIR"], "done.txt"), "w") as f:
    f.write("trained\n")
