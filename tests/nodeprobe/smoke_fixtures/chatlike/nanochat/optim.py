"""Shaped like nanochat's distributed optimizer (written for this test): it averages the gradients itself,
with the world size read from the environment, so it needs the process group that compute_init made."""
import torch
import torch.distributed as dist

from nanochat.common import get_dist_info


class DistSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.world_size = get_dist_info()[3]

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if self.world_size > 1:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG, async_op=True).wait()
                p.add_(p.grad, alpha=-group["lr"])
