"""Test-only: the real trainer, slowed down after one optimizer step, so a test that kills it mid-run
finds it still running.

    SLOW_AFTER_STEP=25 SLOW_STEP_S=0.25 torchrun ... -m tests.helpers.slowed_trainer ARGS

A test sees step N in the metrics, then kills the run; under CI load that takes 0.1-3 s, and a tiny run
has only a second or two of steps left: it ended before the kill. Here every optimizer step after
SLOW_AFTER_STEP also sleeps SLOW_STEP_S (as a slower machine would; the numbers are unchanged), so the
steps left last long, while the steps up to the kill cost nothing more. Only the first group's workers
sleep: an elastic group that re-forms after the kill (TORCHELASTIC_RESTART_COUNT > 0) trains at full speed.
Nothing in trainer/ changes: a global optimizer step post-hook (torch's public API).
"""

import os
import sys
import time

from torch.optim.optimizer import register_optimizer_step_post_hook

from trainer.train import main

_steps = 0


def _sleep(optimizer, args, kwargs) -> None:
    global _steps
    _steps += 1
    if _steps > int(os.environ["SLOW_AFTER_STEP"]):
        time.sleep(float(os.environ["SLOW_STEP_S"]))


if __name__ == "__main__":
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        register_optimizer_step_post_hook(_sleep)
    sys.exit(main(sys.argv[1:]))
