"""ddplab's trainer: a small GPT trained with CPU DDP over gloo (see docs/contracts.md)."""
