"""What the launcher (ddplab/, on the control host) and the trainer (trainer/, on the nodes) agree on.

Stdlib only and free of torch: ddplab imports it on the control host (trainer/ is part of every checkout),
the trainer on the nodes (this file is synced with trainer/); nothing here imports ddplab, which never
leaves the control host. ddplab/plan.py makes and checks a command's run id with it (run_id.yml reads the
plan's pattern, spelled here).
"""

from __future__ import annotations

import re
import time

# a run id: a tmux session name and a folder name on every node
RUN_ID = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
RUN_ID_DOC = "letters, digits, '.', '_' and '-' (at most 64, starting with a letter or digit)"
# a generated run id: run-<local time in this format> (launch.yml adds a random part)
RUN_ID_TIME_FORMAT = "%Y%m%d-%H%M%S"
# rank 0's TCP port for torchrun's rendezvous store (torchrun's own default)
MASTER_PORT = 29500
# seconds a rank waits for a peer before it fails, naming it (ddplab_pg_timeout, the trainer's --pg-timeout-s)
PG_TIMEOUT_S = 45


def is_run_id(text: str) -> bool:
    return re.fullmatch(RUN_ID, text) is not None


def new_run_id(now: float | None = None) -> str:
    """run-YYYYmmdd-HHMMSS at `now` (default: the current time), local time."""
    return "run-" + time.strftime(RUN_ID_TIME_FORMAT, time.localtime(now))

