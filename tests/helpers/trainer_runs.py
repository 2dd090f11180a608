"""Run the trainer as a test does: alone or under torchrun on localhost, with a wall-clock timeout."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# tiny model and run: depth 1, width 64, seq 32, one thread per rank
TINY = ["--depth", "1", "--seq-len", "32", "--batch-size", "4", "--threads", "1", "--log-every", "5"]


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    e.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    return e


def trainer(args, timeout=90, **kw) -> subprocess.CompletedProcess:
    """`python -m trainer ARGS` alone (world size 1)."""
    return subprocess.run([sys.executable, "-m", "trainer", *map(str, args)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=timeout, **kw)


def torchrun_cmd(args, nproc=2, nnodes=1, node_rank=0, port=None, module="trainer") -> list[str]:
    if nnodes == 1:
        launch = ["--standalone", f"--nproc-per-node={nproc}"]
    else:
        launch = [f"--nnodes={nnodes}", f"--node-rank={node_rank}", f"--nproc-per-node={nproc}",
                  "--master-addr=127.0.0.1", f"--master-port={port}", "--rdzv-conf=timeout=60"]
    return [sys.executable, "-m", "torch.distributed.run", *launch, "-m", module, *map(str, args)]


def torchrun(args, nproc=2, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(torchrun_cmd(args, nproc), cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def complete_lines(text: str) -> list[str]:
    """The non-blank, newline-ended lines of a file a running rank is still writing: a read can catch the line
    being written half-way (CI16: '{"step": 74, ... "co')."""
    return [line for line in text[:text.rfind("\n") + 1].splitlines() if line.strip()]


def node_last_step(cluster, host: str, run_id: str, rank: int) -> int:
    """The last step a rank of a run on a simulated host has written to its metrics (0: none yet)."""
    out = cluster.exec(host, ["cat", f"/root/ddplab/runs/{run_id}/out/metrics.rank{rank}.jsonl"], timeout=30)
    lines = complete_lines(out.stdout if out.returncode == 0 else "")
    return json.loads(lines[-1])["step"] if lines else 0


def read_live_jsonl(path) -> list[dict]:
    """The complete records of a JSONL file a running rank is still writing."""
    return [json.loads(line) for line in complete_lines(Path(path).read_text())]


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]
