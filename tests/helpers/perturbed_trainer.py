"""Test-only: the real trainer, with one rank's parameters nudged after one optimizer step.

    PERTURB_RANK=1 PERTURB_AFTER_STEP=2 RANK=... WORLD_SIZE=... python -m tests.helpers.perturbed_trainer ARGS

Nothing in trainer/ changes: a global optimizer step post-hook (torch's public API) adds a small
constant to the first parameter on PERTURB_RANK after its PERTURB_AFTER_STEP-th step. DDP only keeps
ranks identical by applying the same averaged gradient, so the difference stays and the trainer's
parameter checksum must catch it. PERTURB_AFTER_STEP=0 nudges the freshly built model instead (as a CPU
whose random-number kernels differ would initialize it): the trainer must broadcast rank 0's.
"""

import os
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import trainer.start
from trainer.train import main

_steps = 0
_GPT = trainer.start.GPT


def _mine() -> bool:
    return int(os.environ.get("RANK", "0")) == int(os.environ["PERTURB_RANK"])


def _built(*args, **kwargs):
    model = _GPT(*args, **kwargs)
    if _mine() and int(os.environ["PERTURB_AFTER_STEP"]) == 0:
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
    return model


def _nudge(optimizer, args, kwargs) -> None:
    global _steps
    _steps += 1
    if _mine() and _steps == int(os.environ["PERTURB_AFTER_STEP"]):
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].add_(1e-3)


if __name__ == "__main__":
    register_optimizer_step_post_hook(_nudge)
    trainer.start.GPT = _built  # the model build() makes
    sys.exit(main(sys.argv[1:]))
