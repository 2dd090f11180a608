"""On simulated hosts (real sshd, ufw): a bad setting stops launch.yml in the validation play and leaves every
node's lab folder and `ufw status` byte for byte the same. Prints each row's time from command to message.

Run with SIMLAN_LAB=<k> to use a lab beside the default one (inventory/simlan<k>)."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from settings_helpers import REPO, shards  # noqa: F401

pytestmark = [pytest.mark.slow, pytest.mark.simlan]
BIN = Path(sys.executable).parent
HOSTS = ("node0", "node1")
# What a lab folder and the firewall look like: every path with its size, mode and sha256, then ufw.
STATE = ("find /root/ddplab -printf '%p %s %m %T@\\n' | sort; "
         "find /root/ddplab -type f -print0 | sort -z | xargs -0 -r sha256sum; ufw status verbose")
ROWS = {
    "wait_maybe": ("ddplab_wait=maybe", 'ddplab_wait (all): "maybe"'),
    "depth_abc": ("ddplab_trainer_depth=abc", 'ddplab_trainer_depth (all): "abc"'),
    "steps_negative": ("ddplab_trainer_steps=-5", "ddplab_trainer_steps (all): -5;"),
    "nproc_zero": ("ddplab_nproc_per_node=0", "ddplab_nproc_per_node (all): 0;"),
    "port_too_large": ("ddplab_master_port=99999", "ddplab_master_port (all): 99999;"),
    "args_string": ("ddplab_entrypoint_args=--depth=4", 'ddplab_entrypoint_args (all): "--depth=4"'),
    "typo": ("ddplab_trainer_stpes=3", "did you mean ddplab_trainer_steps?"),
    "data_dir_missing": ("ddplab_data_dir=/nonexistent", "ddplab_data_dir (all): /nonexistent does not"),
    "entrypoint_without_code": ("ddplab_entrypoint=missing.py", 'ddplab_code_dir (all): ""'),
}


def node_state(cluster) -> dict[str, str]:
    return {h: cluster.exec(h, ["bash", "-c", STATE], timeout=60).stdout for h in HOSTS}


@pytest.fixture(scope="module")
def lab_nodes(simlan_cluster):
    """Two hosts with a lab folder of their own and ufw active, as after an earlier prepare."""
    cluster = simlan_cluster(2)
    for h in HOSTS:
        script = ("mkdir -p /root/ddplab/code /root/ddplab/runs/old && echo 1 > /root/ddplab/last_run && "
                  "echo x > /root/ddplab/runs/old/exit_code && ufw --force enable >/dev/null && "
                  "ufw allow from 10.77.0.99 to any port 29500 proto tcp >/dev/null")
        cluster.exec(h, ["bash", "-c", script], timeout=60, check=True)
    yield cluster
    simlan_cluster.discard()


TIMES: dict[str, float] = {}


@pytest.mark.parametrize("row", list(ROWS))
def test_bad_setting_leaves_the_nodes_untouched(lab_nodes, shards, tmp_path, row):  # noqa: F811
    setting, message = ROWS[row]
    data = tmp_path / "data"
    shutil.copytree(shards, data)
    before = node_state(lab_nodes)
    argv = [str(BIN / "ansible-playbook"), "-i", str(lab_nodes.inventory_dir), "playbooks/launch.yml",
            "-e", "ddplab_wait=true", "-e", f"ddplab_data_dir={data}",
            "-e", f"ddplab_runs_dir={tmp_path / 'runs'}", "-e", setting]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL, env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
    TIMES[row] = time.monotonic() - start
    print(f"\n{row}: {TIMES[row]:.2f} s; median {statistics.median(TIMES.values()):.2f} s over {len(TIMES)}")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert "ddplab: error: " in out and message in out, out[-3000:]
    assert "PLAY [Prepare" not in out
    assert node_state(lab_nodes) == before
    assert "Status: active" in before["node0"]
