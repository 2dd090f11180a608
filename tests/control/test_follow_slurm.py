"""`ddplab follow` on a lab whose runs go through Slurm (ddplab_scheduler: slurm): the ranks run in the job's
srun step, not in tmux, so follow prints each node's launch.log and ends once every exit code is there.
Local-connection nodes (no SSH, no Slurm needed: what follow reads is the run folder the job writes)."""

from __future__ import annotations

import io

import pytest
import yaml

from ddplab.errors import DdplabError
from ddplab.follow import follow

RUN = "run-20261126-170000-abcd12"


def lab(tmp_path, scheduler: str):
    roots = {name: tmp_path / name for name in ("n0", "n1")}
    hosts = {"ddplab_nodes": {"children": {
        "ddplab_master": {"hosts": {"n0": {"ddplab_node_rank": 0, "ddplab_root": str(roots["n0"])}}},
        "ddplab_workers": {"hosts": {"n1": {"ddplab_node_rank": 1, "ddplab_root": str(roots["n1"])}}}},
        "vars": {"ansible_connection": "local", "ddplab_scheduler": scheduler}}}
    inv = tmp_path / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return inv, roots


def test_a_slurm_run_is_followed_through_its_logs_to_the_end(tmp_path):
    inv, roots = lab(tmp_path, "slurm")
    roots["n0"].mkdir()
    (roots["n0"] / "last_run").write_text(RUN + "\n")
    for rank, root in enumerate(roots.values()):
        run = root / "runs" / RUN
        run.mkdir(parents=True)
        (run / "launch.log").write_text(f"ddplab: run {RUN} rank {rank}\nstep 5/5 | loss 1.0\n")
        (run / "exit_code").write_text("0\n")
    out = io.StringIO()
    assert follow(str(inv), out=out, interval=0.1) == 0
    text = out.getvalue()
    assert f"following run {RUN} on n0, n1" in text
    assert f"n0 | ddplab: run {RUN} rank 0" in text and f"n1 | ddplab: run {RUN} rank 1" in text
    assert text.count("step 5/5") == 2


def test_a_slurm_run_no_node_has_is_named(tmp_path):
    inv, roots = lab(tmp_path, "slurm")
    for root in roots.values():
        root.mkdir()
    with pytest.raises(DdplabError, match=f"run {RUN} has no folder on any node; see playbooks/status.yml"):
        follow(str(inv), run_id=RUN, out=io.StringIO(), once=True)


def test_without_slurm_follow_reads_tmux_panes(tmp_path):
    inv, roots = lab(tmp_path, "none")
    for root in roots.values():
        (root / "runs" / RUN).mkdir(parents=True)  # a run folder, but no tmux session
    with pytest.raises(DdplabError, match=f"run {RUN} has no tmux session on any node"):
        follow(str(inv), run_id=RUN, out=io.StringIO(), once=True)
