"""--elastic: what a rank does at every (re)start under torchrun's elastic agent.

torchrun re-forms the group after a node is lost (or joins) and starts every worker afresh, with
TORCHELASTIC_RESTART_COUNT counting the restarts. There is no shared storage: every node keeps its own
copy of the checkpoints (the local rank 0 of each node writes the same file into its own OUT/ckpt). At a
start the ranks agree on the newest valid checkpoint any of them holds: each reports its newest step
whose sha256 matches, the lowest rank holding the maximum broadcasts the file's bytes, and nodes that
lacked it write the same bytes so they hold a copy from then on. The data position of an elastic
checkpoint is one global shared-stream position (epoch, token offset), valid at any world size.

Each node's local rank 0 then appends one line to OUT/membership.jsonl (time, restart, world size,
nodes by rank, resumed step, steps lost, event), and rank 0 prints one line per re-formation. A node
is named by DDPLAB_NODE_NAME when set (several "nodes" on one machine in tests), else its hostname.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch

from trainer import checkpoint
from trainer import dist as D
from trainer.config import TrainConfig, UsageError
from trainer.data.shared_stream import SharedStreamLoader

MEMBERSHIP = "membership.jsonl"


def node_name() -> str:
    return os.environ.get("DDPLAB_NODE_NAME") or socket.gethostname()


def restart_count() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


# ---- pure decisions (unit-tested) -------------------------------------------------------------------

def choose_source(steps: list[int | None]) -> tuple[int | None, int | None]:
    """(newest step any rank holds, lowest rank holding it); (None, None) when no rank holds one."""
    held = [s for s in steps if s is not None]
    if not held:
        return None, None
    best = max(held)
    return best, steps.index(best)


def lost_steps(progress: list[int], resumed_step: int) -> int:
    """Steps some rank finished before the failure that the resumed checkpoint does not hold."""
    return max(0, max(progress, default=0) - resumed_step)


def event_of(restarts: list[int], resumed_step: int | None) -> str:
    """'start' for a fresh run (no restart, no checkpoint anywhere), else 'reform'."""
    return "start" if max(restarts, default=0) == 0 and resumed_step is None else "reform"


def previous_nodes(lasts: list[dict | None]) -> list[str]:
    """The group before this one: the newest membership record any node holds (by time)."""
    recs = [r for r in lasts if r]
    return max(recs, key=lambda r: r["time"])["nodes"] if recs else []


def reform_line(nodes: list[str], before: list[str], step: int, lost: int) -> str:
    left = [n for n in before if n not in nodes]
    joined = [n for n in nodes if before and n not in before]
    parts = [f"ddplab: re-formed: {len(nodes)} node{'' if len(nodes) == 1 else 's'} ({', '.join(nodes)})"]
    if left:
        parts.append(f"{', '.join(left)} left")
    if joined:
        parts.append(f"{', '.join(joined)} joined")
    return ", ".join(parts) + f"; resuming at step {step} ({lost} steps lost)"


# ---- this node's files ------------------------------------------------------------------------------

def newest_valid(out: str | Path) -> tuple[int | None, Path | None]:
    """The newest checkpoint in OUT/ckpt whose sha256 file exists and matches."""
    for step, path in reversed(checkpoint.list_checkpoints(out)):
        sha = path.with_name(path.name + ".sha256")
        if sha.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == sha.read_text().strip():
            return step, path
    return None, None


def last_membership(out: str | Path) -> dict | None:
    p = Path(out) / MEMBERSHIP
    if not p.exists():
        return None
    lines = [ln for ln in p.read_text().splitlines() if ln.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def progress(out: str | Path, since: float) -> int:
    """The last step this node's metrics files recorded after `since` (this node's previous start)."""
    best = 0
    for p in Path(out).glob("metrics.rank*.jsonl"):
        if p.stat().st_mtime < since:
            continue  # a file of an older group layout
        for ln in p.read_text().splitlines()[-3:]:
            try:
                best = max(best, int(json.loads(ln)["step"]))
            except (ValueError, KeyError, TypeError):
                continue
    return best


# ---- the agreement ----------------------------------------------------------------------------------

def agree_and_load(cfg: TrainConfig, data_digest: str, is_node_writer: bool):
    """Every rank: agree on the newest checkpoint any survivor holds; returns (state or None, info).

    info has the group's nodes (rank order), the previous group's nodes, steps lost and the event.
    """
    out = Path(cfg.out)
    mine_step, mine_path = newest_valid(out) if is_node_writer else (None, None)
    last = last_membership(out) if is_node_writer else None
    mine = {"node": node_name(), "step": mine_step, "restart": restart_count(), "last": last,
            "progress": progress(out, last["time"]) if last else 0}
    everyone = D.all_gather_object(mine)
    step, src = choose_source([e["step"] for e in everyone])
    state = None
    if step is not None:
        data = D.broadcast_bytes(mine_path.read_bytes() if D.info().rank == src else None, src)
        if is_node_writer and (mine_step is None or mine_step < step):
            checkpoint.save_bytes(out, step, data, keep=cfg.ckpt_keep)  # this node now holds a copy
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        state["path"] = f"{everyone[src]['node']}:{checkpoint.ckpt_dir(out) / f'step_{step:06d}.pt'}"
        problem = checkpoint.resume_problem(state, state["path"], cfg, data_digest, world_size=None)
        if problem is None and cfg.run_id and state.get("run_id") != cfg.run_id:
            problem = (f"checkpoint {state['path']} belongs to run {state.get('run_id')}, this is run "
                       f"{cfg.run_id}; choose a new --out for a new run")
        if problem is None and state["data"][0].get("mode") != "shared_stream":
            problem = (f"checkpoint {state['path']} was not written by an --elastic run; resume it "
                       f"without --elastic")
        if problem:
            raise UsageError(problem)
    resumed = step or 0
    info = {"nodes": list(dict.fromkeys(e["node"] for e in everyone)),  # by rank; one entry per node
            "before": previous_nodes([e["last"] for e in everyone]),
            "resumed_step": resumed, "lost_steps": lost_steps([e["progress"] for e in everyone], resumed),
            "event": event_of([e["restart"] for e in everyone], step),
            "restart": max(e["restart"] for e in everyone), "src": src}
    return state, info


def record_membership(cfg: TrainConfig, info: dict, world_size: int, is_node_writer: bool) -> None:
    """One line in this node's OUT/membership.jsonl; rank 0 prints the re-formation line."""
    if is_node_writer:
        rec = {"time": time.time(), "restart": info["restart"], "world_size": world_size,
               "nodes": info["nodes"], "resumed_step": info["resumed_step"], "lost_steps": info["lost_steps"],
               "event": info["event"]}
        Path(cfg.out).mkdir(parents=True, exist_ok=True)
        with open(Path(cfg.out) / MEMBERSHIP, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
    if info["event"] == "reform":
        D.print0(reform_line(info["nodes"], info["before"], info["resumed_step"], info["lost_steps"]))
        sys.stdout.flush()


class UniformStream(SharedStreamLoader):
    """The shared stream with every rank taking --batch-size sequences per micro-step: the position is
    global, so a group of any size continues where the last one stopped, skipping and repeating nothing."""

    def __init__(self, ds, rank: int, world_size: int, batch_size: int, seq_len: int):
        super().__init__(ds, rank, seq_len)
        self.uniform = [batch_size] * world_size

    def next_batch(self, shares: list[int] | None = None):
        return super().next_batch(shares or self.uniform)
