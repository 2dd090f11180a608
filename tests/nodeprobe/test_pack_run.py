"""nodeprobe/pack_run.py: the archive collect_logs.yml fetches is 0600 and carries no ddplab_env value."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = ("# Environment of run r1 on node0 (rank 0).\nDDPLAB_RUN_ID=r1\nNODE_RANK=0\nGLOO_SOCKET_IFNAME=eth0\n"
       "# ddplab_env (its values may be secrets: collect_logs.yml packs this file with them redacted)\n"
       "WANDB_API_KEY=s3cret-token\nHF_TOKEN='hf_abc=def'\n")


def test_the_archive_is_private_and_redacts_the_users_environment(tmp_path):
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "trainer.env").write_text(ENV)
    (run / "trainer.env").chmod(0o600)
    (run / "launch.log").write_text("step 1\n")
    out = tmp_path / "collect.tgz"
    proc = subprocess.run([sys.executable, "-m", "nodeprobe.pack_run", str(run), str(out), "--socket",
                           str(tmp_path / "none.sock"), "--session", "r1", "--pattern", "trainer.env",
                           "--pattern", "launch.log"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    assert json.loads(proc.stdout)["files"] == ["launch.log", "trainer.env"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        env = tar.extractfile("trainer.env").read().decode()
        assert tar.getmember("trainer.env").mode == 0o600
        assert tar.extractfile("launch.log").read() == b"step 1\n"
    assert "s3cret" not in env and "hf_abc" not in env
    assert "WANDB_API_KEY=<redacted>" in env and "HF_TOKEN=<redacted>" in env
    assert "DDPLAB_RUN_ID=r1" in env and "GLOO_SOCKET_IFNAME=eth0" in env  # ddplab's own lines stay
    assert (run / "trainer.env").read_text() == ENV  # the node's copy is untouched
