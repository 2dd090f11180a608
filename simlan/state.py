"""Where simlan keeps what it made: a state directory with `cluster.json` (every name and PID it
created), per-host folders, and a lock file beside it so two simlan commands never interleave."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from pathlib import Path

from simlan.errors import SimlanError

DEFAULT_STATE = "/run/simlan"
STATE_FILE = "cluster.json"


def state_dir(path: str | os.PathLike | None = None) -> Path:
    """The state directory: `path`, else $SIMLAN_STATE, else /run/simlan."""
    lab = os.environ.get("SIMLAN_LAB", "0") or "0"
    default = DEFAULT_STATE if lab == "0" else f"{DEFAULT_STATE}{lab}"
    return Path(path or os.environ.get("SIMLAN_STATE") or default)


def load(state: Path) -> dict | None:
    """The recorded cluster, or None when there is none."""
    try:
        return json.loads((state / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SimlanError(
            f"cannot read {state / STATE_FILE} ({exc}); inspect it, or remove the cluster's "
            "namespaces by hand (`ip netns list`) and delete the file", code=2) from exc


def save(state: Path, data: dict) -> None:
    """Write cluster.json atomically (a reader never sees half a file)."""
    state.mkdir(parents=True, exist_ok=True)
    tmp = state / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(state / STATE_FILE)


@contextlib.contextmanager
def flock_file(lock_path: Path, timeout: float, busy: str, code: int = 1, poll: float = 0.1):
    """Hold an exclusive flock on lock_path; after `timeout` s of waiting, SimlanError(busy)."""
    with open(lock_path, "a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SimlanError(busy, code=code) from None
                time.sleep(poll)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def locked(state: Path, timeout: float = 60.0):
    """Hold an exclusive lock beside the state directory (it survives `down` removing the directory)."""
    lock_path = state.parent / f"{state.name}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with flock_file(lock_path, timeout, f"another simlan command holds {lock_path} for more than "
                    f"{timeout:g} s; wait for it to finish", code=2):
        yield
