"""How gradients travel between ranks: the DDP communication hook, chosen by --comm.

Every option is wrapped by `metrics.timed_hook`, so the all-reduce each step really does is timed and
its bytes counted. fp32 is torch's default all-reduce (`allreduce_hook`, same result as no hook).
Issue 5 adds bf16/fp16 compression and PowerSGD (torch's built-in hooks) to `_INNER_HOOKS`.
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from trainer.metrics import CommTimer, timed_hook

_INNER_HOOKS = {
    "fp32": default_hooks.allreduce_hook,
}


def register_comm_hook(ddp_model, comm: str, timer: CommTimer, process_group=None) -> None:
    """Install the --comm hook on a DDP model (no-op on a bare model: world size 1 without torchrun)."""
    if not hasattr(ddp_model, "register_comm_hook"):
        return
    ddp_model.register_comm_hook(state=process_group, hook=timed_hook(_INNER_HOOKS[comm], timer))
