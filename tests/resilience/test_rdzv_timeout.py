"""torchrun's static rendezvous is bounded: `--rdzv-conf timeout=N` is applied (torch's default is 600 s)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]


def test_master_alone_gives_up_after_the_rendezvous_timeout(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "0",
            "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
            "--rdzv-conf", "timeout=8", "-m", "trainer", "--data", str(tmp_path),
            "--out", str(tmp_path / "o")]
    t0 = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode != 0
    assert "timed out" in proc.stderr.lower() or "timeout" in proc.stderr.lower(), proc.stderr[-2000:]
    assert 8 <= took < 60, f"gave up after {took:.1f} s (rendezvous timeout 8 s)"  # not torch's 600 s
