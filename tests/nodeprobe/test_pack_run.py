"""nodeprobe/pack_run.py: the archive collect_logs.yml fetches is 0600, carries no ddplab_env value, and its
SHA-256 is printed."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

from ddplab.launch_render import render_launch
from nodeprobe import pack_run

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
    proc = subprocess.run([sys.executable, "-m", "nodeprobe", "pack-run", str(run), str(out), "--socket",
                           str(tmp_path / "none.sock"), "--session", "r1", "--pattern", "trainer.env",
                           "--pattern", "launch.log"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=True)
    printed = json.loads(proc.stdout)
    assert printed["files"] == ["launch.log", "trainer.env"]
    # the control host checks its copy against it (plugins/action/ddplab_fetch.py), with no stat module
    assert printed["sha256"] == hashlib.sha256(out.read_bytes()).hexdigest()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        env = tar.extractfile("trainer.env").read().decode()
        assert tar.getmember("trainer.env").mode == 0o600
        assert tar.extractfile("launch.log").read() == b"step 1\n"
    assert "s3cret" not in env and "hf_abc" not in env
    assert "WANDB_API_KEY=<redacted>" in env and "HF_TOKEN=<redacted>" in env
    assert "DDPLAB_RUN_ID=r1" in env and "GLOO_SOCKET_IFNAME=eth0" in env  # ddplab's own lines stay
    assert (run / "trainer.env").read_text() == ENV  # the node's copy is untouched


SECRETS = {"PEM": "-----BEGIN KEY-----\nAAAA=\nsecret-line-2\n-----END KEY-----",
           "QUOTED": "it's \"quoted\" and ends in '", "EQUALS": "a=b=c", "HASH": "x # not a comment",
           "NEWLINE_EQ": "first\nLEAK=second", "PLAIN": "plainsecret"}


def rendered_env(env: dict) -> str:
    """roles/launch/templates/trainer.env.j2 for one node with ddplab_env = env
    (ddplab/launch_render.py: the role's defaults and vars, the facts a play sets)."""
    lab = {"root": "/l", "code": "/l/code", "pythonpath": "/l/code", "data": "/l/data", "runs": "/l/runs",
           "socket": "/l/tmux.sock", "python_file": "/l/python", "compile_cache": "/l/compile-cache"}
    facts = {"ddplab_lab": lab, "ddplab_run": "r1", "ddplab_run_dir": "/l/runs/r1",
             "ddplab_rank_cwd": "/l/code", "ddplab_master_addr": "10.0.0.1", "ddplab_master_port": 29500,
             "ddplab_node_rank": 0, "ddplab_world_size": 1, "ddplab_run_hosts": ["node0"],
             "ddplab_node_addr": "10.0.0.1", "ddplab_nproc_per_node": 1, "ddplab_byo": True,
             "ddplab_code_dir": "/src", "ddplab_entrypoint": "train.py",
             "gloo_network_env": {"GLOO_SOCKET_IFNAME": "eth0"}, "ddplab_env": env,
             "launch_rank_python": "python3", "launch_rank_threads": 1, "launch_resume_run": False}
    return render_launch(facts)["trainer.env"]


def test_redaction_is_by_key_for_multi_line_quoted_and_equals_values(tmp_path):
    """Each value reaches the rank whole (bash sources the file) and none of it reaches the archive."""
    text = rendered_env(SECRETS)
    env_file = tmp_path / "trainer.env"
    env_file.write_text(text)
    show = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {[*SECRETS, 'LEAK']}}}))"
    sourced = subprocess.run(["bash", "-c", f"set -a; . {env_file}; python3 -c \"$0\"", show], text=True,
                             capture_output=True, timeout=30, check=True, env={"PATH": "/usr/bin:/bin"})
    assert json.loads(sourced.stdout) == {**SECRETS, "LEAK": None}
    redacted = pack_run.redact_env(text)
    for value in SECRETS.values():
        for part in value.split("\n") + ["LEAK"]:
            assert part not in redacted, (part, redacted)
    assert redacted.split(pack_run.SECRETS_FROM)[1].splitlines()[1:] == [f"{k}=<redacted>"
                                                                         for k in sorted(SECRETS)]
    assert "GLOO_SOCKET_IFNAME=eth0" in redacted and "MASTER_PORT=29500" in redacted  # ddplab's own stay
    broken = text.replace("PLAIN=plainsecret", "PLAIN='plainsecret")
    assert pack_run.redact_env(broken).endswith(pack_run.UNREADABLE + "\n")
    assert "plainsecret" not in pack_run.redact_env(broken)
    assert "secret-line-2" not in pack_run.redact_env(broken)
