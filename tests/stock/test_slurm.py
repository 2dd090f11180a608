"""ddplab_scheduler slurm on a real Slurm 22.05 (issue 32): two stock hosts without Slurm (their own Debian 12
root filesystems, login `lab` with a sudo password) made a Slurm cluster by playbooks/slurm.yml, then runs
submitted with sbatch. docs/slurm.md's commands run as typed, `-i` naming this module's inventory.
The hosts are the ones test_stock_ddplab.py prepared, with ufw installed and inactive on node0, when both
modules run (`make test`, tests/stock/conftest.py); bare ones when this module runs alone.

One cluster serves the module, in order: slurm.yml on hosts without Slurm (then changed=0, and --check --diff
changed=0), a 2-node run through sbatch to the end with a rank on each node, two runs submitted while another
user's job holds the nodes (both queue, then run one after the other), the script `python -m ddplab export
sbatch` writes, submitted with sbatch. Times are printed (`pytest -s`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail
from tests.test_readme import SLURM_DOCS, readme_commands, run

pytestmark = [pytest.mark.slow, pytest.mark.simlan]


@pytest.fixture(scope="module")
def lab(stock_hosts, tmp_path_factory):
    t0 = time.monotonic()
    c = stock_hosts(Path(__file__).name)
    before = stock_hosts.before(Path(__file__).name)
    runs = tmp_path_factory.mktemp("slurm-runs")
    settings = {"ddplab_scheduler": "slurm", "ddplab_data_dir": str(make_shards(tmp_path_factory.getbasetemp()
                                                                                / "shards")),
                "ddplab_runs_dir": str(runs), "ddplab_threads": 1, "ddplab_wait_poll": 5,
                "ddplab_trainer_steps": 5}
    settings_file = c.inventory_dir / "group_vars" / "all" / "ddplab.yml"
    settings_file.write_text(yaml.safe_dump(settings))
    try:
        yield {"cluster": c, "inv": c.inventory_dir, "runs": runs, "t0": t0,
               "hosts": f"stock hosts {' and '.join(before)} prepared" if before else "bare stock hosts"}
    finally:  # the inventory folder outlives this module: a later cluster on it must not run through Slurm
        settings_file.unlink(missing_ok=True)


def docs_command(cmd: str, inv) -> subprocess.CompletedProcess:
    assert cmd in readme_commands(), f"{cmd!r} is no longer in docs/slurm.md"
    return run(cmd.replace("-i inventory/mylab", f"-i {inv}"), timeout=1200)


def on_master(c, cmd: str) -> str:
    return c.exec("node0", ["su", "lab", "-c", cmd], timeout=60, check=True).stdout


def test_slurm_cluster_from_hosts_without_slurm_runs_a_two_node_job(lab):
    c, inv = lab["cluster"], lab["inv"]
    setup = docs_command(SLURM_DOCS[0], inv)
    t_setup = time.monotonic() - lab["t0"]
    assert setup.returncode == 0, tail(setup)
    deadline = time.monotonic() + 60  # a slurmd registers with the controller a few seconds after it starts
    while (sinfo := on_master(c, "sinfo -h -o '%t %N'")).split() != ["idle", "node[0-1]"]:
        assert time.monotonic() < deadline, sinfo
        time.sleep(2)
    again = playbook("slurm.yml", inventory=inv, timeout=600)
    checked = playbook("slurm.yml", "--check", "--diff", inventory=inv, timeout=600)
    for proc in (again, checked):
        assert proc.returncode == 0, tail(proc)
        assert {h: r["changed"] for h, r in recap(proc).items()} == {"node0": 0, "node1": 0}, tail(proc)
    key_file = lab["runs"] / ".slurm" / "munge.key"  # beside the runs, never in the inventory folder
    key = key_file.read_text().strip()
    assert len(key) == 64 and key_file.stat().st_mode & 0o077 == 0
    assert not (inv / ".slurm").exists()
    for proc in (setup, again, checked):
        assert key not in proc.stdout + proc.stderr  # no_log, no diff
    t1 = time.monotonic()
    launched = docs_command(SLURM_DOCS[1], inv)
    t_run = time.monotonic() - t1
    assert launched.returncode == 0, tail(launched, 120)
    print(f"\nslurm: {lab['hosts']} to a Slurm cluster {t_setup:.0f} s; first launch (prepare + sbatch "
          f"run, 5 steps) {t_run:.0f} s; to trained {time.monotonic() - lab['t0']:.0f} s")
    run_id = re.search(r"run (\S+) is Slurm job (\d+)", launched.stdout)
    assert run_id, tail(launched, 120)
    # the launch's preflight saw each node as a working member of the cluster (its slurm row)
    verdict = json.loads((lab["runs"] / "preflight" / "latest.json").read_text())["hosts"]
    rows = {h: verdict[h]["slurm"]["detail"] for h in ("node0", "node1")}
    assert rows == {"node0": "munged, slurmd and slurmctld up; node0 idle",
                    "node1": "munged, slurmd up; node1 idle"}, rows
    summary = json.loads((lab["runs"] / run_id[1] / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    out = on_master(c, f"cat ~/ddplab/runs/{run_id[1]}/slurm-{run_id[2]}.out")
    assert "rank 0/2 on node0" in out and "rank 1/2 on node1" in out, out
    status = docs_command(SLURM_DOCS[2], inv)
    assert status.returncode == 0 and re.search(r"node1\s+rank 1\s+finished", status.stdout), tail(status)
    # follow reads a Slurm run's launch.log on each node (it has no tmux pane)
    followed = subprocess.run([sys.executable, "-m", "ddplab", "follow", "-i", str(inv), "--once"], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert re.search(r"^node0\s+\| .*ddplab: done", followed.stdout, re.M), followed.stdout
    assert re.search(r"^node1\s+\| ", followed.stdout, re.M), followed.stdout


def test_two_runs_submitted_at_once_queue_and_both_finish(lab):
    """Another user's job holds both nodes (a shared cluster): both runs are queued behind it, not refused,
    and run one after the other once it ends. The job holds the nodes until it is cancelled, so no run has
    to train long enough to still be running when the next is submitted (queue-a used to train 300 steps
    for that, and with 30 it had sometimes finished already)."""
    c, inv = lab["cluster"], lab["inv"]
    t0 = time.monotonic()
    other = on_master(c, "sbatch --parsable --exclusive -N 2 --job-name=other-user --chdir=/tmp "
                      "--output=/dev/null --wrap 'sleep 900'").strip()
    try:
        for run_id in ("queue-a", "queue-b"):
            proc = playbook("launch.yml", inventory=inv,
                            extra={"ddplab_run_id": run_id, "ddplab_trainer_steps": 30}, timeout=600)
            assert proc.returncode == 0, tail(proc)
            # queued, not refused (the reason shows once slurmctld's next scheduling pass saw the job)
            pending = rf"run {run_id} is Slurm job \d+ \(pending(, (Resources|Priority))?\)"
            assert re.search(pending, proc.stdout), tail(proc)
    finally:
        on_master(c, f"scancel {other}")
    done = playbook("launch.yml", inventory=inv, extra={"ddplab_run_id": "queue-c", "ddplab_trainer_steps": 1,
                                                       "ddplab_wait": "true"}, timeout=900)
    assert done.returncode == 0, tail(done)
    rows = [ln.split() for ln in on_master(c, "squeue -h --states=all -o '%j %T %S %e'").splitlines()]
    jobs = {r[0]: r[1:] for r in rows}
    spans = [f"{n} {s[0]} {s[1][11:]}..{s[2][11:]}" for n, s in sorted(jobs.items())
             if n.startswith("ddplab-queue")]
    print(f"\nslurm: two runs queued behind another user's job, and a third, all done in "
          f"{time.monotonic() - t0:.0f} s: " + "; ".join(spans))
    a, b, c_ = jobs["ddplab-queue-a"], jobs["ddplab-queue-b"], jobs["ddplab-queue-c"]
    assert a[0] == b[0] == c_[0] == "COMPLETED", rows
    assert a[2] <= b[1] and b[2] <= c_[1], rows  # one after the other
    for run_id in ("queue-a", "queue-b"):
        st = playbook("status.yml", inventory=inv, extra={"ddplab_run_id": run_id}, timeout=300)
        assert re.search(r"node0\s+rank 0\s+finished", st.stdout), tail(st)


def test_exported_sbatch_script_trains_on_both_nodes(lab):
    """docs/slurm.md's export commands as typed: the script written on the control host, checked and
    submitted on the master (the nodes' lab folder stands for the cluster's shared file system: ddplab's
    launch put the same code, shards and venv on both)."""
    c, inv = lab["cluster"], lab["inv"]
    export, check, submit = SLURM_DOCS[3:6]
    assert {export, check, submit} <= set(readme_commands()), "the export commands left docs/slurm.md"
    root = on_master(c, "echo $HOME").strip() + "/ddplab"
    script = REPO / "job.sbatch"
    assert not script.exists(), f"{script} exists: the docs command would refuse to overwrite it"
    t0 = time.monotonic()
    try:
        made = run(export.replace("-i inventory/mylab", f"-i {inv}").replace("/shared/ddplab", root), 300)
        assert made.returncode == 0, tail(made)
        text = script.read_text()
    finally:
        script.unlink(missing_ok=True)
    c.exec("node0", ["su", "lab", "-c", "cat > ~/job.sbatch"], input=text, check=True)
    checked = c.exec("node0", ["su", "lab", "-c", f"cd ~ && {check}"], timeout=300)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "ddplab: data:" in checked.stdout and "match the manifest" in checked.stdout, checked.stdout
    job = re.search(r"Submitted batch job (\d+)", on_master(c, f"cd ~ && {submit}"))
    assert job, "sbatch printed no job id"
    deadline = time.monotonic() + 900
    state = ""
    while time.monotonic() < deadline:
        state = re.search(r"JobState=(\S+)", on_master(c, f"scontrol show job --oneliner {job[1]}"))[1]
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            break
        time.sleep(3)
    out = on_master(c, f"cat ~/slurm-{job[1]}.out")
    print(f"\nslurm: exported script, export + check + sbatch run (5 steps) {time.monotonic() - t0:.0f} s")
    assert state == "COMPLETED", out[-3000:]
    assert re.search(r"ddplab: run \S+ rank 0/2 on node0 master \S+ iface \S+", out), out[-3000:]
    assert re.search(r"ddplab: run \S+ rank 1/2 on node1 master \S+ iface \S+", out), out[-3000:]
    assert "ddplab: done" in out, out[-3000:]


def test_preflight_names_a_node_whose_slurmd_stopped_and_slurm_yml_starts_it_again(lab):
    """Last in the module: it stops a daemon. A job sent to that node would wait in the queue for ever;
    preflight (and so launch.yml) refuses before sbatch, naming the node and the fix."""
    c, inv = lab["cluster"], lab["inv"]
    c.exec("node1", ["pkill", "-x", "slurmd"], timeout=30, check=True)
    checked = playbook("preflight.yml", inventory=inv, timeout=600)
    assert checked.returncode != 0, tail(checked)
    assert "FAIL node1 slurm: slurmd not running on node1" in checked.stdout, tail(checked)
    assert "fix: run playbooks/slurm.yml (it installs and starts munge and Slurm)" in checked.stdout
    assert "FAIL node0" not in checked.stdout, tail(checked)
    fixed = playbook("slurm.yml", inventory=inv, timeout=600)
    assert fixed.returncode == 0, tail(fixed)
    deadline = time.monotonic() + 60
    while (sinfo := on_master(c, "sinfo -h -o '%t %N'")).split() != ["idle", "node[0-1]"]:
        assert time.monotonic() < deadline, sinfo
        time.sleep(2)
