"""When the syncs of the low-communication mode fall (`--sync-every H`, `--sync-schedule`).

- `constant`: a sync point every H steps after the per-step warm-up (every H/F steps with
  `--sync-fragments F`, one fragment per point), and the run's last step.
- `inverse-lr` / `qsr`: the period grows as the learning rate decays, H x (peak / lr) or H x (peak / lr)^2
  steps, where lr is the rate at the step that opens the period. `qsr` is the Quadratic Synchronization Rule
  (Gu, Lyu, Arora, Zhang, Huang, ICLR 2024: H = max(H_base, (alpha / lr)^2), here with alpha = peak x
  sqrt(H), so H_base = H at the peak); the paper compares it with H ~ 1/lr, which `inverse-lr` is. A rank's
  drift between syncs grows with lr^2 x H, so a schedule that syncs often while the rate is high and seldom
  once it has decayed spends the same bytes where they matter more. The warm-up's rising rate counts as
  the peak (a tiny rate there would stretch the first period).

The points are a function of the step count and the learning-rate schedule only, so every rank (and a
resumed run) computes the same ones.
"""

from __future__ import annotations

from collections.abc import Callable

GROWTH = {"constant": 0, "inverse-lr": 1, "qsr": 2}  # the period grows with (peak / lr) ** this


def sync_points(steps: int, sync_every: int, fragments: int = 1, per_step_until: int = 0,
                schedule: str = "constant", lr_ratio: Callable[[int], float] | None = None) -> list[int]:
    """The steps done (1-based) after which a sync point falls, in order, ending with `steps`.
    `lr_ratio(step)`: the learning rate at 0-based `step` over its peak (needed unless `constant`)."""
    growth = GROWTH[schedule]
    points, done = [], per_step_until
    while done < steps:
        stretch = (1 / lr_ratio(done)) ** growth if growth else 1
        done += max(1, round(sync_every * stretch / fragments))
        points.append(min(done, steps))
    return points
