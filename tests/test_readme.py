"""The README is a test: every command in the ```bash blocks of README.md and of the docs pages
(docs/*.md) runs here exactly as typed (no extra -e), on the inventory it names, from the repository root
with the venv's tools first on PATH.

`make test` is the one exception: it is what CI runs (.ci/run), so it cannot run inside itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README = "\n".join(p.read_text() for p in PAGES)
EXEMPT = {"make test": "the CI entry itself (.ci/run runs it)"}
# docs/slurm.md: run as typed by tests/stock/test_slurm.py on stock hosts (Slurm is installed into their
# own root filesystems), with `-i` naming that test's inventory instead of inventory/mylab.
SLURM_DOCS = [
    "ansible-playbook -i inventory/mylab playbooks/slurm.yml",
    "ansible-playbook -i inventory/mylab playbooks/launch.yml -e ddplab_wait=true",
    "ansible-playbook -i inventory/mylab playbooks/status.yml",
    # export sbatch: `/shared/ddplab` is replaced by the nodes' lab folder; the last two run on the master
    ("python -m ddplab export sbatch -i inventory/mylab --root /shared/ddplab "
     "--python /shared/ddplab/venv/bin/python -o job.sbatch"),
    "bash job.sbatch check-only",
    "sbatch job.sbatch",
]
EXEMPT.update(dict.fromkeys(SLURM_DOCS, "tests/stock/test_slurm.py"))
# Commands of the local blocks, in the order a reader runs them (data first: launch needs shards).
LOCAL = [
    "python -m trainer.data prepare --out data/shards",
    ("torchrun --standalone --nproc_per_node=2 -m trainer --data data/shards --out runs/t --steps 20 "
     "--depth 2"),
    "python -m trainer --help",
    "ansible-playbook -i inventory/local playbooks/launch.yml -e ddplab_wait=true",
    "make demo",
    "make tune",
]
SIMLAN = [
    "python -m simlan up --nodes 2",
    "ansible-playbook -i inventory/simlan playbooks/launch.yml -e ddplab_wait=true",
    "ansible-playbook -i inventory/simlan playbooks/status.yml -l node1",
    "python -m simlan down",
]


def readme_commands() -> list[str]:
    """Each command line of the bash blocks of the README and the docs pages, comments stripped."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            cmd = line.split("  #")[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


def run(cmd: str, timeout: float) -> subprocess.CompletedProcess:
    # A reader has no SIMLAN_LAB: `simlan up` then makes lab 0, which `-i inventory/simlan` names (a
    # parallel test worker's own lab is another one, tests/helpers/workers.py).
    env = {**{k: v for k, v in os.environ.items() if k != "SIMLAN_LAB"},
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run(["bash", "-c", cmd], cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_every_readme_command_is_run_by_a_test():
    shown = readme_commands()
    assert shown, "no ```bash block found in README.md or docs/"
    assert set(shown) - set(LOCAL) - set(SIMLAN) - set(EXEMPT) == set()
    for cmd in LOCAL + SIMLAN:
        assert cmd in shown, f"{cmd!r} is no longer in README.md or docs/: update tests/test_readme.py"


@pytest.mark.slow
def test_local_readme_commands_run_as_typed():
    shutil.rmtree(REPO / "runs" / "t", ignore_errors=True)
    for cmd in LOCAL:
        proc = run(cmd, timeout=900)
        assert proc.returncode == 0, f"{cmd}\n{(proc.stdout + proc.stderr)[-3000:]}"
        if "launch.yml" in cmd or cmd == "make demo":
            assert "failed=0" in proc.stdout and "byte_equivalent: True" in (proc.stdout + run(
                "cat runs/$(cat ~/ddplab/local0/last_run)/report.md", 30).stdout)
        if cmd == "make demo":
            observe_the_last_local_run()
        if cmd == "make tune":  # every layout trained and was timed; the table, the advice and the plot
            for layout in ("1x1 | 1 x 1", "1x2 | 1 x 2", "all | 2 x 1"):
                row = next(ln for ln in proc.stdout.splitlines() if ln.startswith(f"| {layout} |"))
                assert float(row.split("|")[4]) > 0, row
            assert re.search(r"^\*\*use (1x1|1x2|all): ", proc.stdout, re.M)
            out = Path(re.search(r"wrote (\S+)/tune\.md", proc.stdout).group(1))
            assert (out / "tune.png").read_bytes()[:4] == b"\x89PNG"
            shutil.rmtree(out)


def observe_the_last_local_run() -> None:
    """What a reader sees of `make demo`'s run: its files collected from both ranks' lab folders, status.yml
    finding the last run without its id, stop.yml closing its tmux session on each rank, the run still
    `finished` after it."""
    lab = Path.home() / "ddplab"
    run_id = (lab / "local0" / "last_run").read_text().strip()
    folder = REPO / "runs" / run_id
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["byte_equivalent"] is True
    assert summary["exit_codes"] == {"local0/rank0": 0, "local1/rank1": 0}
    steps = summary["steps"]
    for host in ("local0", "local1"):  # each inventory host has its own lab folder and tmux socket
        assert (folder / host / "pane.txt").read_text().count(f"ddplab: run {run_id}") == 1
        assert "exited with code 0" in (folder / host / "launch.log").read_text()
        assert (lab / host / "runs" / run_id / "exit_code").read_text().strip() == "0"
    assert "ddplab: done" in (folder / "local0" / "launch.log").read_text()
    finished = re.compile(rf"local\d\s+rank \d+\s+finished\s+step {steps}\b")
    for playbook in ("status.yml", "stop.yml", "status.yml"):  # a finished run stays finished after a stop
        proc = run(f"ansible-playbook -i inventory/local playbooks/{playbook}", 120)
        assert proc.returncode == 0, proc.stdout[-3000:]
        if playbook == "status.yml":
            shown = finished.findall(proc.stdout)
            assert f"run {run_id}" in proc.stdout and len(shown) == 2, proc.stdout[-3000:]
        else:
            for host in ("local0", "local1"):
                alive = subprocess.run(["tmux", "-S", str(lab / host / "tmux.sock"), "has-session", "-t",
                                        f"={run_id}"], capture_output=True, timeout=30)
                assert alive.returncode != 0, f"{host}'s tmux session of {run_id} outlived stop.yml"
