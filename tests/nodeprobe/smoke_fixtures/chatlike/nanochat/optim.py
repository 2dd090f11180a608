"""Shaped like nanochat's distributed optimizer (written for this test): it averages the gradients itself,
with the world size read from the environment, so it needs the process group that compute_init made; a
large parameter's gradient is reduce-scattered and waited on through a future, as nanochat does."""
import torch
import torch.distributed as dist

from nanochat.common import get_dist_info


class DistSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        self.world_size = get_dist_info()[3]

    @torch.no_grad()
    def step(self):
        world = self.world_size
        for group in self.param_groups:
            for p in group["params"]:
                if world > 1 and p.shape[0] % world == 0:
                    part = torch.empty_like(p.grad[: p.shape[0] // world])
                    work = dist.reduce_scatter_tensor(part, p.grad, op=dist.ReduceOp.AVG, async_op=True)
                    work.get_future().wait()
                    dist.all_gather_into_tensor(p.grad, part)
                elif world > 1:
                    dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
                p.add_(p.grad, alpha=-group["lr"])
