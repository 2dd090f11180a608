"""The optimizer: AdamW over the matrices, fused into one kernel when torch can on the parameters' device,
and its learning-rate schedule.

Measured on the ~10.8M model (depth 6, width 384, 1 thread, this machine): the default (foreach) AdamW
step takes ~38 ms, the fused one ~7 ms, with the same update (bench/results/trainer_speed.md). torch
fuses AdamW for floating-point parameters on CPU and CUDA; anything else keeps the default.
"""

from __future__ import annotations

import math

import torch

from trainer.config import TrainConfig

FUSED_DEVICES = ("cpu", "cuda")
FUSED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def can_fuse(params: list[torch.Tensor]) -> bool:
    return bool(params) and all(p.device.type in FUSED_DEVICES and p.dtype in FUSED_DTYPES for p in params)


def make_adamw(params, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with nanoGPT's betas; weight decay on every given parameter (the trainer passes the matrices)."""
    params = list(params)
    return torch.optim.AdamW([{"params": params, "weight_decay": weight_decay}], lr=lr, betas=(0.9, 0.95),
                             eps=1e-8, fused=True if can_fuse(params) else None)


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to lr*min_lr_frac at the last step (step is 0-based)."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    span = max(1, cfg.steps - cfg.lr_warmup_steps)
    progress = min(1.0, (step - cfg.lr_warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def lr_ratio_at(cfg: TrainConfig, step: int) -> float:
    """The learning rate at 0-based `step` over its peak, the warm-up counting as the peak: what
    --sync-schedule stretches the sync period by (trainer/sync_schedule.py)."""
    return lr_at(cfg, max(step, cfg.lr_warmup_steps)) / cfg.lr
