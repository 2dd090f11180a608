"""ddplab_scheduler slurm on a real Slurm 22.05 (issue 32): two stock hosts without Slurm (their own Debian 12
root filesystems, login `lab` with a sudo password) made a Slurm cluster by playbooks/slurm.yml, then runs
submitted with sbatch. docs/slurm.md's commands run as typed, `-i` naming this module's inventory.
The hosts are the ones test_stock_ddplab.py prepared, with ufw installed and inactive on node0, when both
modules run (`make test`, tests/stock/conftest.py); bare ones when this module runs alone.

One cluster serves the module, in order: slurm.yml --check on hosts without Slurm (it says what it would
install), slurm.yml (a key left in runs/.slurm moves to the secrets folder, then changed=0, and --check
--diff changed=0), a 2-node run through sbatch to the end with a rank on each node, a run user whose gid
differs on one node refused, another owner with the same uid and root refused a job (AllowGroups,
DisableRootJobs), two runs submitted while another user's job holds the nodes (both queue, then run one
after the other), a run on part of the lab (ddplab_slurm_nodes) beside another user's job (and waiting
ddplab-* jobs that are not this lab's), the script `python -m ddplab export sbatch` writes, submitted
with sbatch; a stopped
slurmd named by preflight; a host outside the lab refused; a node lost mid-job.
Times are printed (`pytest -s`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from simlan.outsider import address as outsider_address
from simlan.outsider import outsider
from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail
from tests.test_readme import SLURM_DOCS, readme_commands, run

pytestmark = [pytest.mark.slow, pytest.mark.simlan]


@pytest.fixture(scope="module")
def lab(stock_hosts, tmp_path_factory):
    t0 = time.monotonic()
    c = stock_hosts(Path(__file__).name)
    before = stock_hosts.before(Path(__file__).name)
    runs = tmp_path_factory.mktemp("slurm-runs")
    secrets = tmp_path_factory.mktemp("slurm-config") / "ddplab" / "lab"  # made 0700 by slurm.yml
    settings = {"ddplab_scheduler": "slurm", "ddplab_data_dir": str(make_shards(tmp_path_factory.getbasetemp()
                                                                                / "shards")),
                "ddplab_runs_dir": str(runs), "ddplab_secrets_dir": str(secrets), "ddplab_threads": 1,
                "ddplab_wait_poll": 5, "ddplab_trainer_steps": 5,
                # the hosts stay as their user keeps them, open to the LAN (node0's ufw off, node1's off or
                # none): said so explicitly, since launch refuses them otherwise; the munge key is what keeps
                # others out of Slurm (test_a_host_outside_the_lab_can_neither_run_a_job_nor_join)
                "ddplab_open_to_lan": True}
    settings_file = c.inventory_dir / "group_vars" / "all" / "ddplab.yml"
    settings_file.write_text(yaml.safe_dump(settings))
    try:
        yield {"cluster": c, "inv": c.inventory_dir, "runs": runs, "secrets": secrets, "t0": t0,
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
    # --check on hosts without Slurm: says what it would install, changes nothing, makes no munge key
    dry = playbook("slurm.yml", "--check", "--diff", inventory=inv, timeout=600)
    assert dry.returncode == 0, tail(dry)
    assert "node1: would install munge, slurmd, slurm-client (no daemon" in dry.stdout, tail(dry)
    assert not (lab["runs"] / ".slurm").exists() and not lab["secrets"].exists()
    setup = docs_command(SLURM_DOCS[0], inv)
    t_setup = time.monotonic() - lab["t0"]
    assert setup.returncode == 0, tail(setup)
    deadline = time.monotonic() + 60  # a slurmd registers with the controller a few seconds after it starts
    while (sinfo := on_master(c, "sinfo -h -o '%t %N'")).split() != ["idle", "node[0-1]"]:
        assert time.monotonic() < deadline, sinfo
        time.sleep(2)
    key_file = lab["secrets"] / "munge.key"  # the lab's 0700 secrets folder: not in runs/ nor the inventory
    key = key_file.read_text().strip()
    assert len(key) == 64 and key_file.stat().st_mode & 0o077 == 0
    assert lab["secrets"].stat().st_mode & 0o777 == lab["secrets"].parent.stat().st_mode & 0o777 == 0o700
    assert not (inv / ".slurm").exists() and not (lab["runs"] / ".slurm").exists()
    # a cluster set up by an older ddplab has its key in runs/.slurm: it moves to the secrets folder (the
    # cluster keeps its key: the nodes change nothing), then every later run changes nothing
    old_key = lab["runs"] / ".slurm" / "munge.key"
    old_key.parent.mkdir()
    key_file.rename(old_key)
    moved = playbook("slurm.yml", inventory=inv, timeout=600)
    again = playbook("slurm.yml", inventory=inv, timeout=600)
    checked = playbook("slurm.yml", "--check", "--diff", inventory=inv, timeout=600)
    assert moved.returncode == 0, tail(moved)
    assert f"moved the munge key: {old_key} -> {key_file}" in moved.stdout, tail(moved)
    assert {h: r["changed"] for h, r in recap(moved).items()} == {"node0": 1, "node1": 0}, tail(moved)
    assert key_file.read_text().strip() == key and not old_key.parent.exists()
    for proc in (again, checked):
        assert proc.returncode == 0, tail(proc)
        assert {h: r["changed"] for h, r in recap(proc).items()} == {"node0": 0, "node1": 0}, tail(proc)
    for proc in (setup, moved, again, checked):
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


def test_a_run_user_whose_gid_differs_on_one_node_is_refused_before_any_change(lab):
    """Slurm runs a job on every node under the submitter's numbers: with lab's group 1777 on node1 and 1000
    on node0, lab's jobs would run on node1 in group 1000, whoever that is there. slurm.yml refuses the lab
    with one message naming both nodes, the user, both uids and gids and the fix; no node changed."""
    c, inv = lab["cluster"], lab["inv"]
    conf = ["stat", "-c", "%Y", "/etc/slurm/slurm.conf"]
    before = [c.exec(h, conf, check=True).stdout for h in ("node0", "node1")]
    # the group and the user's primary gid, by hand (usermod -g would also change the files' group in ~lab)
    renumber = "groupmod -g {0} lab && sed -i 's/^lab:x:1000:[0-9]*:/lab:x:1000:{0}:/' /etc/passwd && id lab"
    assert "gid=1777(lab)" in c.exec("node1", ["sh", "-c", renumber.format(1777)], check=True).stdout
    try:
        refused = playbook("slurm.yml", inventory=inv, timeout=600)
    finally:
        c.exec("node1", ["sh", "-c", renumber.format(1000)], check=True)
    assert refused.returncode != 0, tail(refused)
    assert ("ddplab: error: the run user differs between node0 and node1: lab is uid 1000 gid 1000 on node0, "
            "lab is uid 1000 gid 1777 on node1.") in refused.stdout, tail(refused)
    assert "(as root on node1: groupmod -g 1000 lab; usermod -g 1000 lab), or use" in refused.stdout
    assert "Traceback" not in refused.stdout + refused.stderr
    assert {h: r["changed"] for h, r in recap(refused).items()} == {"node0": 0, "node1": 0}, tail(refused)
    assert [c.exec(h, conf, check=True).stdout for h in ("node0", "node1")] == before


# Another person on the lab's machines. node1's own user bob is uid 1500; on node0 (the controller)
# mallory's account, made separately, happens to have uid 1500 too (the first account of two people's
# machines is often 1000 on both). mallory asks for a step on node1, and root for one on node1.
# (srun's stdin is /dev/null: it would pass this script's rest to the step)
OWNER_ATTEMPTS = r"""
cd /tmp
echo "== mallory srun"; runuser -u mallory -- timeout 60 srun -N1 -w node1 --job-name=mallory \
  sh -c 'id -un > /home/bob/mallory-was-here' < /dev/null 2>&1; echo "rc=$?"
echo "== mallory sbatch"; runuser -u mallory -- sbatch -N1 -w node1 --job-name=mallory --output=/dev/null \
  --wrap 'id -un > /home/bob/mallory-was-here' 2>&1; echo "rc=$?"
echo "== root srun"; timeout 60 srun -N1 -w node1 --job-name=root touch /tmp/root-job-ran < /dev/null 2>&1
echo "rc=$?"
"""


def test_another_owner_with_the_same_uid_and_root_run_no_job_on_the_lab(lab):
    """No one let in. slurm.conf admits only the lab's group (AllowGroups, the run user's group) and no root
    job (DisableRootJobs): mallory's srun and sbatch onto node1, which would run as bob there, and root's
    srun are refused by slurmctld; nothing ran on node1, and the lab's own jobs still run (the other
    tests)."""
    c = lab["cluster"]
    c.exec("node1", ["useradd", "-m", "-u", "1500", "bob"], check=True)
    c.exec("node0", ["useradd", "-m", "-u", "1500", "mallory"], check=True)
    try:
        tried = c.exec("node0", ["bash", "-s"], input=OWNER_ATTEMPTS, timeout=240)
        out = tried.stdout
        print(f"\nslurm: another owner and root tried:\n{out}")
        attempts = {name: code for name, _, code in re.findall(r"^== ([\w ]+)\n(.*?)^rc=(\d+)$", out,
                                                                re.M | re.S)}
        assert set(attempts) == {"mallory srun", "mallory sbatch", "root srun"}, out
        assert all(code != "0" for code in attempts.values()), out
        assert out.count("User's group not permitted to use this partition") == 2, out
        # DisableRootJobs: slurmctld refuses a job of uid 0 (Slurm 22.05's words)
        root_refused = "== root srun\nsrun: error: Unable to allocate resources: Invalid user id\n"
        assert root_refused in out, out
        assert c.exec("node1", ["test", "-e", "/home/bob/mallory-was-here"]).returncode != 0
        assert c.exec("node1", ["test", "-e", "/tmp/root-job-ran"]).returncode != 0
        assert on_master(c, "squeue -h --states=all -o %j").split().count("mallory") == 0
    finally:
        c.exec("node0", ["bash", "-c", "scancel -u mallory; scancel -n root; userdel -r mallory"], timeout=60)
        c.exec("node1", ["userdel", "-r", "bob"], timeout=60)


def test_two_runs_submitted_at_once_queue_and_both_finish(lab):
    """Another user's job holds both nodes (a shared cluster): both runs are queued behind it, not refused,
    and run one after the other once it ends. The job holds the nodes until it is cancelled, so no run has
    to train long enough to still be running when the next is submitted (queue-a used to train 300 steps
    for that, and with 30 it had sometimes finished already)."""
    c, inv = lab["cluster"], lab["inv"]
    t0 = time.monotonic()
    other = on_master(c, "sbatch --parsable --exclusive -N 2 --job-name=other-user --chdir=/tmp "
                      "--output=/dev/null --wrap 'sleep 900'").strip()
    job_ids = {}
    try:
        for run_id in ("queue-a", "queue-b"):
            proc = playbook("launch.yml", inventory=inv,
                            extra={"ddplab_run_id": run_id, "ddplab_trainer_steps": 30}, timeout=600)
            assert proc.returncode == 0, tail(proc)
            # queued, not refused (the reason shows once slurmctld's next scheduling pass saw the job)
            # (Resources, Priority, or "Nodes required for job are DOWN, ..." while a busy node answers late)
            pending = re.search(rf"run {run_id} is Slurm job (\d+) \(pending(, [^)]+)?\); its output",
                                proc.stdout)
            assert pending, tail(proc)
            job_ids[run_id] = pending[1]
    finally:
        on_master(c, f"scancel {other}")
    done = playbook("launch.yml", inventory=inv, extra={"ddplab_run_id": "queue-c", "ddplab_trainer_steps": 1,
                                                       "ddplab_wait": "true"}, timeout=900)
    assert done.returncode == 0, tail(done)
    job_ids["queue-c"] = re.search(r"run queue-c is Slurm job (\d+)", done.stdout)[1]
    rows = [ln.split() for ln in on_master(c, "squeue -h --states=all -o '%i %T %S %e %j'").splitlines()]
    jobs = {r[0]: r[1:] for r in rows}
    spans = [f"{jobs[j][3]} {jobs[j][0]} {jobs[j][1][11:]}..{jobs[j][2][11:]}" for j in job_ids.values()]
    print(f"\nslurm: two runs queued behind another user's job, and a third, all done in "
          f"{time.monotonic() - t0:.0f} s: " + "; ".join(spans))
    # each named after this lab's tag and the run
    assert all(re.fullmatch(rf"ddplab-[0-9a-f]{{8}}-{r}", jobs[j][3]) for r, j in job_ids.items()), rows
    a, b, c_ = (jobs[job_ids[r]] for r in ("queue-a", "queue-b", "queue-c"))
    assert a[0] == b[0] == c_[0] == "COMPLETED", rows
    assert a[2] <= b[1] and b[2] <= c_[1], rows  # one after the other
    for run_id in ("queue-a", "queue-b"):
        st = playbook("status.yml", inventory=inv, extra={"ddplab_run_id": run_id}, timeout=300)
        assert re.search(r"node0\s+rank 0\s+finished", st.stdout), tail(st)


def test_a_run_on_part_of_the_lab_trains_while_another_job_holds_the_rest(lab):
    """ddplab_slurm_nodes 1: the job asks for node0 alone (rank 0), so it runs at once while another user's
    job holds node1, and everything of the run (status, outcome, logs, summary) is of node0 alone.
    Meanwhile a colleague in the lab's group has a job named ddplab-x waiting, and the run user a waiting
    job of another lab folder (its tag is not this lab's): neither is a run of this lab, so the launch
    checks and prepares the nodes as usual (it used to take any ddplab-* job for one and skip both)."""
    c, inv = lab["cluster"], lab["inv"]
    other = on_master(c, "sbatch --parsable --exclusive -N 1 -w node1 --job-name=other-user --chdir=/tmp "
                      "--output=/dev/null --wrap 'sleep 900'").strip()
    c.exec("node0", ["useradd", "-m", "-g", "lab", "colleague"], check=True)
    # slurmctld reads the members of AllowGroups when it starts or is told to (slurm.conf(5))
    c.exec("node0", ["scontrol", "reconfigure"], check=True)
    held = "sbatch --parsable --hold -N 1 --chdir=/tmp --output=/dev/null --wrap true --job-name="
    not_ours = [c.exec("node0", ["su", "colleague", "-c", held + "ddplab-x"], check=True).stdout.strip(),
                on_master(c, held + "ddplab-0badc0de-x").strip()]
    verdict = lab["runs"] / "preflight" / "latest.json"
    checked_before = verdict.stat().st_mtime_ns
    try:
        t0 = time.monotonic()
        run = playbook("launch.yml", inventory=inv, extra={"ddplab_run_id": "part-a", "ddplab_slurm_nodes": 1,
                                                           "ddplab_trainer_steps": 5, "ddplab_wait": "true"},
                       timeout=600)
        print(f"\nslurm: a 1-node run beside another user's job on node1, launched to collected in "
              f"{time.monotonic() - t0:.0f} s")
        assert run.returncode == 0, tail(run, 120)
        assert "other-user" in on_master(c, f"squeue -h -j {other} -o '%j %T'")  # still holding node1
        assert "neither checked nor prepared" not in run.stdout, tail(run, 120)
        assert verdict.stat().st_mtime_ns > checked_before  # preflight ran: the nodes were checked
        assert re.search(r"run part-a is Slurm job \d+", run.stdout), tail(run, 120)
        # still waiting, untouched: the launch neither counted nor cancelled them
        states = on_master(c, "squeue -h --states=all -j " + ",".join(not_ours) + " -o %T").split()
        assert states == ["PENDING", "PENDING"], states
    finally:
        c.exec("node0", ["scancel", other, *not_ours], timeout=60)
        c.exec("node0", ["userdel", "-r", "colleague"], timeout=60)
    summary = json.loads((lab["runs"] / "part-a" / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["exit_codes"] == {"node0/rank0": 0}, summary
    assert "rank 0/1 on node0" in on_master(c, "cat ~/ddplab/runs/part-a/slurm-*.out")
    assert c.exec("node1", ["test", "-e", "/home/lab/ddplab/runs/part-a"]).returncode != 0
    status = playbook("status.yml", inventory=inv, extra={"ddplab_run_id": "part-a", "ddplab_slurm_nodes": 1},
                      timeout=300)
    assert re.search(r"node0\s+rank 0\s+finished", status.stdout), tail(status)
    assert not re.search(r"node1\s+rank 1", status.stdout), tail(status)  # no row: not in the run


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


# A host on the LAN that is not one of the lab's: its own address, Slurm's own programs (those of a stock
# host) and a munge key of its own. It tries to submit a job, to run one with srun, to read the cluster,
# and to join it as node1 (a slurmd that registers under that name).
OUTSIDER_ATTEMPTS = r"""
d=/tmp/outsider; mkdir -m 700 "$d"
head -c 48 /dev/urandom | base64 -w0 > "$d/key"; chmod 400 "$d/key"
munged -F --force --key-file="$d/key" --socket="$d/sock" --pid-file="$d/pid" --log-file="$d/log" \
  --seed-file="$d/seed" 2>/dev/null & munged=$!
for _ in $(seq 50); do [ -S "$d/sock" ] && break; sleep 0.1; done
sed -e "s|^AuthType=auth/munge|&\nAuthInfo=socket=$d/sock|" -e "s|^SlurmdSpoolDir=.*|SlurmdSpoolDir=$d|" \
  -e "s|^SlurmdPidFile=.*|SlurmdPidFile=$d/slurmd.pid|" \
  -e "s|^SlurmdLogFile=.*|SlurmdLogFile=$d/slurmd.log|" /etc/slurm/slurm.conf > "$d/slurm.conf"
cp /etc/slurm/cgroup.conf "$d/"
export SLURM_CONF="$d/slurm.conf"
echo "== sbatch"; sbatch --job-name=outsider --wrap 'touch /tmp/outsider-ran' 2>&1; echo "rc=$?"
echo "== srun"; timeout 60 srun --job-name=outsider -N1 -w node1 touch /tmp/outsider-ran 2>&1; echo "rc=$?"
echo "== sinfo"; sinfo -h 2>&1; echo "rc=$?"
echo "== join"; timeout 8 slurmd -D -N node1 -f "$d/slurm.conf" > /dev/null 2>&1; echo "rc=$?"
kill "$munged"; wait "$munged" 2>/dev/null; rm -rf "$d"
"""


def test_a_host_outside_the_lab_can_neither_run_a_job_nor_join(lab):
    """No one let in. Slurm's ports answer the whole LAN here (node0's ufw is off as its user keeps it,
    node1's is off or absent; ddplab_open_to_lan), so the munge key is what keeps others out. A real attempt
    from a host outside the inventory (simlan.outsider): slurmctld refuses each request as not signed by the
    lab's key, no job exists and nothing ran, node1 is still the lab's own."""
    c = lab["cluster"]
    log = ["cat", "/var/log/slurm/slurmctld.log"]  # root's to read
    log_lines = len(c.exec("node0", log, check=True).stdout.splitlines())
    with outsider(c, programs_of="node1") as argv:
        tried = subprocess.run(argv + ["bash", "-s"], input=OUTSIDER_ATTEMPTS, capture_output=True, text=True,
                               timeout=180)
    out = tried.stdout
    assert tried.returncode == 0, out + tried.stderr[-2000:]
    attempts = {name: code for name, _, code in re.findall(r"^== (\w+)\n(.*?)^rc=(\d+)$", out, re.M | re.S)}
    assert set(attempts) == {"sbatch", "srun", "sinfo", "join"}, out
    assert all(code != "0" for code in attempts.values()), out
    # the client's words depend on when slurmctld dropped the connection ("Zero Bytes were transmitted or
    # received", or on a busy machine "Socket timed out on send/recv operation"); its log says why
    for refused in ("sbatch: error: Batch job submission failed: ",
                    "srun: error: Unable to allocate resources: ", "slurm_load_partitions: "):
        assert refused in out, out
    addr = outsider_address()
    # slurmctld names each refused request with the outsider's address; on a busy machine a client may give up
    # before the controller reads its request (CI19: sbatch and srun timed out, sinfo and the join were
    # logged), so the log must show the join refused and at least one client request refused
    who = rf"\[\[{re.escape(addr)}\]:\d+\] auth_g_verify:"
    refusals = [rf"{who} MESSAGE_NODE_REGISTRATION_STATUS has authentication error",
                rf"{who} REQUEST_\w+ has authentication error"]
    deadline = time.monotonic() + 30
    while True:
        seen = "\n".join(c.exec("node0", log, check=True).stdout.splitlines()[log_lines:])
        missing = [r for r in refusals if not re.search(r, seen)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not missing, f"{missing}\n{seen[-3000:]}"
    assert "outsider" not in on_master(c, "squeue -h --states=all -o %j")
    for host in ("node0", "node1"):
        assert c.exec(host, ["test", "-e", "/tmp/outsider-ran"]).returncode != 0, host
    assert on_master(c, "sinfo -h -N -o '%N %t %o'").split() == ["node0", "idle", c.host("node0").addr,
                                                                 "node1", "idle", c.host("node1").addr]


def test_a_node_lost_mid_job_ends_the_job_and_status_names_it(lab):
    """node1 loses power while the job trains (simlan kill-host: every process gone, cable pulled). Slurm
    marks it down after SlurmdTimeout and ends the job (NODE_FAIL), which ends node0's rank too if gloo's
    timeout has not ended it first (both take about 45 s); the job is not requeued (a rerun would start over
    in the same run folder). status.yml names node1 as the cause. Switched on again, node1 serves the
    cluster after slurm.yml restarts its daemons. Last in the module: it takes a host down."""
    c, inv = lab["cluster"], lab["inv"]
    launched = playbook("launch.yml", inventory=inv, extra={"ddplab_run_id": "lost-node",
                                                           "ddplab_trainer_steps": 3000}, timeout=600)
    assert launched.returncode == 0, tail(launched)
    job_id = re.search(r"run lost-node is Slurm job (\d+)", launched.stdout)[1]
    metrics = "~/ddplab/runs/lost-node/out/metrics.rank0.jsonl"
    deadline = time.monotonic() + 300
    while not re.search(r'"step": [3-9]', on_master(c, f"cat {metrics} 2>/dev/null || true")):
        assert time.monotonic() < deadline, on_master(c, "squeue; tail -5 ~/ddplab/runs/lost-node/launch.log")
        time.sleep(2)
    t0 = time.monotonic()
    c.kill_host("node1")
    try:
        job = ""
        while "NODE_FAIL" not in job:
            assert time.monotonic() < t0 + 240, job
            time.sleep(3)
            job = on_master(c, f"squeue -h --states=all -j {job_id} -o %T")
        print(f"\nslurm: node1 lost mid-job; the job ended NODE_FAIL {time.monotonic() - t0:.0f} s later")
        status = playbook("status.yml", inventory=inv, extra={"ddplab_run_id": "lost-node"}, timeout=600)
        assert re.search(r"^\s*\"node1\s+rank 1\s+not answering", status.stdout, re.M), tail(status)
        # whichever came first: Slurm ended node0's rank (NODE_FAIL), or gloo's timeout did (it lost its peer)
        ended = (r"node0\s+rank 0\s+(failed \(no exit code; its Slurm job is NODE_FAIL\)\s+step \d+/3000"
                 r"|failed \(exit code 1\)\s+step \d+/3000 .*\| ddplab: error: lost peer rank 1 \(node1)")
        assert re.search(ended, status.stdout), tail(status)
        assert "not answering: node1 (rank 1): no answer over SSH" in status.stdout, tail(status)
        assert job.split() == ["NODE_FAIL"], job  # ended once, not requeued
    finally:
        c.revive_host("node1")
    again = playbook("slurm.yml", inventory=inv, timeout=600)
    assert again.returncode == 0, tail(again)
    deadline = time.monotonic() + 90  # ReturnToService=2: it registers and is idle again
    while (sinfo := on_master(c, "sinfo -h -o '%t %N'")).split() != ["idle", "node[0-1]"]:
        assert time.monotonic() < deadline, sinfo
        time.sleep(2)
