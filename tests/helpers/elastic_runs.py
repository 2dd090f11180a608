"""Elastic runs on loopback: a standalone rendezvous store and one torchrun elastic agent per "node".

Every agent is a c10d client of a TCPStore this helper starts in its own process (`is_host=false`), so
killing any agent, the one whose worker is rank 0 included, leaves the rendezvous intact (as the
control-host store of `ddplab rdzv-store` does on real machines). Each agent runs in its own session:
killing its process group kills the agent and its workers at once, as losing the machine would. Each
"node" has its own --out (its node-local disk) and its own name (DDPLAB_NODE_NAME).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers.trainer_runs import REPO, env, free_port, read_jsonl, read_live_jsonl

# rendezvous timings for loopback: a missing node is given up after 2 s of last call, a dead one after
# 3 missed 1 s heartbeats
RDZV_CONF = "timeout=60,join_timeout=60,last_call_timeout=2,keep_alive_interval=1,keep_alive_max_attempt=3"

class Store:
    """A TCPStore server in its own process: the rendezvous that lives on no training node."""

    def __init__(self):
        self.port = free_port()
        # the control host's own store (`ddplab rdzv-store serve`), as launch.yml starts it
        self.folder = Path(tempfile.mkdtemp(prefix="ddplab-store-"))  # removed by stop()
        ready = self.folder / "ready"
        argv = [sys.executable, "-m", "ddplab", "rdzv-store", "serve", "--bind", "127.0.0.1", "--port",
                str(self.port), "--allow", "127.0.0.1", "--ready", str(ready)]
        self.proc = subprocess.Popen(argv, cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, "the store did not start"
            time.sleep(0.05)

    def stop(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


class Agent:
    """One node: `torch.distributed.run` elastic agent (1 worker) with its own --out and log files."""

    def __init__(self, name: str, root: Path, store: Store, trainer_args: list, nnodes="2:3",
                 max_restarts=3, run_id="elastic-test", log="agent.log", module="trainer", env_extra=None):
        self.name, self.out = name, root / name / "out"
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.log = root / name / log
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", "--nproc-per-node=1",
               f"--max-restarts={max_restarts}", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{store.port}", f"--rdzv-id={run_id}",
               f"--rdzv-conf=is_host=false,{RDZV_CONF}", "--local-addr=127.0.0.1", "--monitor-interval=0.2",
               "-m", module, *map(str, trainer_args), "--out", str(self.out), "--elastic"]
        # TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1: with the default (the workers share a TCPStore server that
        # the rank-0 agent hosts), torch 2.13's c10d handler caches the first round's master address on
        # every agent that is not rank 0 (dynamic_rendezvous.py, next_rendezvous), so after the master
        # node is lost the survivors' workers dial the dead master's store and never form a group. With
        # it, every round publishes a fresh master address and port under the round's key prefix.
        e = env() | {"DDPLAB_NODE_NAME": name, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"} | (env_extra or {})
        with open(self.log, "w") as f:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=e, stdout=f, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def kill(self) -> float:
        """SIGKILL the agent and its workers (torchrun starts each worker in a session of its own, so the
        agent's process group alone would leave the workers training): the node is gone. Returns the time."""
        pids = descendants(self.proc.pid)
        t = time.time()
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        self.proc.wait()
        return t

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout=timeout)

    def text(self) -> str:
        return self.log.read_text()

    def metrics(self) -> list[dict]:
        """This node's step records (any rank it held), in file-write order."""
        recs = []
        for p in sorted(self.out.glob("metrics.rank*.jsonl")):
            recs += read_jsonl(p)
        return recs

    def membership(self) -> list[dict]:
        p = self.out / "membership.jsonl"
        return read_live_jsonl(p) if p.exists() else []

    def stop(self):
        if self.proc.poll() is None:
            self.kill()


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children of children too), from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def rank_of(agent: Agent) -> int | None:
    """The rank this node's worker holds now, from the newest metrics file."""
    files = sorted(agent.out.glob("metrics.rank*.jsonl"), key=lambda p: p.stat().st_mtime)
    return int(files[-1].name.split("rank")[1].split(".")[0]) if files else None


def wait_for_step(agents: list[Agent], step: int, timeout: float = 90) -> None:
    """Until some node's metrics show `step` done."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for a in agents:
            for p in a.out.glob("metrics.rank*.jsonl"):
                records = read_live_jsonl(p)
                if records and records[-1]["step"] >= step:
                    return
        time.sleep(0.05)
    raise TimeoutError(f"no node reached step {step} in {timeout} s")
