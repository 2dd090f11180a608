# ruff: noqa
# Shaped like nanochat (compute_init, DistAdamW, -m scripts.base_train), cut to what ddplab's code check reads.
import torch
import torch.distributed as dist

class DistAdamW(torch.optim.Optimizer):
    @torch.no_grad()
    def step(self):
        reduce_scatter_futures = []
        for group in self.param_groups:
            for p in group["params"]:
                grad = p.grad
                grad_slice = torch.empty_like(grad[: grad.shape[0] // 2])
                reduce_scatter_futures.append(dist.reduce_scatter_tensor(grad_slice, grad, op=dist.ReduceOp.AVG, async_op=True).get_future())
        torch.futures.collect_all(reduce_scatter_futures).wait()
