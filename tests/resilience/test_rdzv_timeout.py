"""The launch role's real launch.sh bounds torchrun's static rendezvous (`--rdzv-conf timeout=N`; torch's
default is 600 s): the master alone gives up after N seconds, and the script records the exit code."""

import os
import shlex
import socket
import subprocess
import sys
import time

import pytest

from ddplab.launch_render import REPO, render_launch
from trainer.cli import check_args

RDZV_TIMEOUT_S = 8


def _render(tmp_path, port: int) -> dict[str, str]:
    lab = {"root": str(tmp_path), "code": str(REPO), "pythonpath": str(REPO), "data": str(tmp_path / "data"),
           "runs": str(tmp_path / "runs"), "socket": str(tmp_path / "tmux.sock"),
           "python_file": str(tmp_path / "python"), "compile_cache": str(tmp_path / "compile-cache")}
    # the facts that roles/ddplab (facts, dirs, run_id) and the launch role's own tasks set on a node
    facts = {"ddplab_lab": lab, "ddplab_run": "run-rdzv", "ddplab_run_dir": f"{lab['runs']}/run-rdzv",
             "ddplab_rank_cwd": f"{lab['runs']}/run-rdzv",
             "ddplab_master_addr": "127.0.0.1", "ddplab_master_port": port, "ddplab_node_rank": 0,
             "ddplab_world_size": 2, "ddplab_run_hosts": ["node0", "node1"], "ddplab_node_addr": "127.0.0.1",
             "ddplab_rdzv_timeout": RDZV_TIMEOUT_S,
             "ddplab_byo": False,
             "launch_rank_python": sys.executable, "launch_rank_threads": 1, "launch_resume_run": False}
    return render_launch(facts)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_launch_script_passes_the_trainer_valid_arguments(tmp_path):
    script = _render(tmp_path, 29500)["launch.sh"]
    line = next(ln for ln in script.splitlines() if " -m trainer " in f"{ln} ")
    argv = shlex.split(line.rstrip("\\"))
    args = [("1" if a == "$DDPLAB_THREADS" else a) for a in argv[argv.index("trainer") + 1:]]
    assert f"--rdzv-conf timeout={RDZV_TIMEOUT_S}" in script
    assert check_args(args) is None, check_args(args)


@pytest.mark.slow
def test_master_alone_gives_up_after_the_rendezvous_timeout(tmp_path):
    rendered = _render(tmp_path, _free_port())
    run_dir = tmp_path / "runs" / "run-rdzv"
    run_dir.mkdir(parents=True)
    for name, text in rendered.items():
        (run_dir / name).write_text(text)
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH")}
    t0 = time.monotonic()
    proc = subprocess.run(["bash", str(run_dir / "launch.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    took = time.monotonic() - t0
    log = (run_dir / "launch.log").read_text()
    assert proc.returncode != 0, log[-2000:]
    assert (run_dir / "exit_code").read_text().strip() == str(proc.returncode)
    assert "timed out" in log.lower() or "timeout" in log.lower(), log[-2000:]
    assert f"ddplab: rank 0 exited with code {proc.returncode}" in log
    assert RDZV_TIMEOUT_S <= took < 60, f"gave up after {took:.1f} s (rendezvous timeout {RDZV_TIMEOUT_S} s)"
