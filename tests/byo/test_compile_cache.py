"""The launch role's real launch.sh, trainer.env and rank_python, run here as one node of 2 local ranks
(torchrun on 127.0.0.1) on a small DDP model under torch.compile: each local rank compiles cold into a
folder of its own under the lab's compile cache (torchrun runs it through rank_python, its PYTHON_EXEC),
with its TMPDIR there too, never into torch's shared TMPDIR/torchinductor_<user> (which another local user
can create first and fill), and both finish; a cache named in ddplab_env is kept."""

from __future__ import annotations

import getpass
import os
import socket
import stat
import subprocess
import sys

import pytest

from ddplab.launch_render import REPO, render_launch

FIXTURES = REPO / "tests" / "nodeprobe" / "smoke_fixtures"
PLACED = {"launch.sh": "launch.sh", "trainer.env": "trainer.env", "rank_python.sh": "rank_python"}


def render(tmp_path, env: dict | None = None) -> dict[str, str]:
    root = tmp_path / "lab"
    lab = {"root": str(root), "code": str(root / "code"), "pythonpath": str(FIXTURES),
           "data": str(root / "data"), "runs": str(root / "runs"), "socket": str(root / "tmux.sock"),
           "python_file": str(root / "python"), "compile_cache": str(root / "compile-cache")}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run_dir = f"{lab['runs']}/run-compile"
    facts = {"ddplab_lab": lab, "ddplab_run": "run-compile", "ddplab_run_dir": run_dir,
             "ddplab_rank_cwd": run_dir,
             "ddplab_master_addr": "127.0.0.1", "ddplab_master_port": port, "ddplab_node_rank": 0,
             "ddplab_world_size": 1, "ddplab_run_hosts": ["node0"], "ddplab_node_addr": "127.0.0.1",
             "ddplab_nproc_per_node": 2, "ddplab_byo": True, "ddplab_code_dir": str(FIXTURES),
             "ddplab_entrypoint": "compiled_ddp.py", "ddplab_env": env or {},
             "launch_rank_python": sys.executable, "launch_rank_threads": 1, "launch_resume_run": False}
    return render_launch(facts)


def test_a_cache_set_in_ddplab_env_is_used_as_set(tmp_path):
    rendered = render(tmp_path, {"TORCHINDUCTOR_CACHE_DIR": "/srv/compile"})
    assert "PYTHON_EXEC" not in rendered["trainer.env"]
    assert "DDPLAB_COMPILE_CACHE" not in rendered["trainer.env"]
    assert "TORCHINDUCTOR_CACHE_DIR=/srv/compile" in rendered["trainer.env"]


@pytest.mark.slow
def test_local_ranks_compile_cold_into_folders_of_their_own(tmp_path):
    rendered = render(tmp_path)
    run_dir = tmp_path / "lab" / "runs" / "run-compile"
    run_dir.mkdir(parents=True)
    for name, text in rendered.items():  # as start-rank places them (roles/launch/tasks/main.yml)
        (run_dir / PLACED[name]).write_text(text)
    (run_dir / "rank_python").chmod(0o755)
    planted = tmp_path / "tmp" / f"torchinductor_{getpass.getuser()}"  # another local user made it first
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    unset = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
             "TORCHINDUCTOR_CACHE_DIR")
    env = {k: v for k, v in os.environ.items() if k not in unset} | {"TMPDIR": str(planted.parent)}
    proc = subprocess.run(["bash", str(run_dir / "launch.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    log = (run_dir / "launch.log").read_text()
    assert proc.returncode == 0, log[-3000:]
    cache = tmp_path / "lab" / "compile-cache"
    for rank in (0, 1):
        mine = cache / f"local{rank}"
        assert f"rank {rank} compile cache {mine} tmp {mine}/tmp" in log, log[-3000:]
        assert list((cache / f"local{rank}").rglob("*.so")), f"rank {rank} built nothing in its folder"
    assert sorted(p.name for p in cache.iterdir()) == ["local0", "local1"]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700
    assert list(planted.iterdir()) == []  # torch's precompiled headers went to the rank's own TMPDIR too
