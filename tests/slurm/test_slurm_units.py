"""The Slurm pieces that run without Slurm: slurm.conf's data and text (roles/slurm), the job's data
(roles/launch/filter_plugins/slurm_job.py), a Slurm run's rank state (nodeprobe/run_status.py) and the
daemon starter for hosts without systemd (nodeprobe/daemons.py, on real processes)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from ansible.errors import AnsibleFilterError

from ddplab.node_command import nodeprobe_command
from nodeprobe import daemons
from nodeprobe.run_status import alive_state

REPO = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


conf = _load("slurm_conf", REPO / "roles/slurm/filter_plugins/slurm_conf.py")
job = _load("slurm_job", REPO / "roles/launch/filter_plugins/slurm_job.py")
owner = _load("slurm_owner", REPO / "roles/slurm/filter_plugins/slurm_owner.py")

HOSTVARS = {
    "laptop-b": {"ansible_hostname": "bee", "ansible_processor_vcpus": 4, "ansible_memtotal_mb": 7900},
    "laptop-a": {"ansible_hostname": "ant", "ansible_processor_vcpus": 8, "ansible_memtotal_mb": 15800},
}
ADDRS = {"laptop-a": "192.168.1.10", "laptop-b": "192.168.1.11"}


def test_conf_data_comes_from_each_nodes_facts_sorted_by_slurm_name():
    data = conf.slurm_conf(["laptop-b", "laptop-a"], HOSTVARS, ADDRS, "laptop-a", "60001-60100")
    assert data["controller"] == {"name": "ant", "addr": "192.168.1.10"}
    assert [(n["name"], n["addr"], n["cpus"], n["real_memory"]) for n in data["nodes"]] == [
        ("ant", "192.168.1.10", 8, 15800 - conf.MEMORY_SLACK_MB),
        ("bee", "192.168.1.11", 4, 7900 - conf.MEMORY_SLACK_MB)]
    assert data["partition"] == {"name": "lab", "nodes": "ant,bee"}
    assert conf.slurm_names(data) == {"laptop-a": "ant", "laptop-b": "bee"}


def test_conf_refuses_two_nodes_with_one_hostname_and_a_controller_outside_the_lab():
    twins = {h: {**v, "ansible_hostname": "debian"} for h, v in HOSTVARS.items()}
    with pytest.raises(AnsibleFilterError,
                       match=r"laptop-b: has the hostname 'debian' like laptop-a.*hostnamectl"):
        conf.slurm_conf(["laptop-a", "laptop-b"], twins, ADDRS, "laptop-a", "60001-60100")
    with pytest.raises(AnsibleFilterError, match=r"gpu-box: ddplab_slurm_controller is not a node.*laptop-a"):
        conf.slurm_conf(["laptop-a", "laptop-b"], HOSTVARS, ADDRS, "gpu-box", "60001-60100")


def test_rendered_slurm_conf_names_every_node_the_ports_and_no_cgroup_plugins():
    data = conf.slurm_conf(["laptop-a", "laptop-b"], HOSTVARS, ADDRS, "laptop-a", "60001-60100")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(REPO / "roles/slurm/templates"), trim_blocks=True,
                             undefined=jinja2.StrictUndefined)
    text = env.get_template("slurm.conf.j2").render(
        slurm_conf_data=data, slurm_cluster_name="ddplab", ansible_managed="managed",
        ddplab_slurmctld_port=6817, ddplab_slurmd_port=6818, slurm_slurmd_timeout=30,
        slurm_allow_groups=owner.slurm_allow_groups("", {"group": "lab"}))
    lines = text.splitlines()
    assert "SlurmctldHost=ant(192.168.1.10)" in lines and "SrunPortRange=60001-60100" in lines
    assert "NodeName=bee NodeAddr=192.168.1.11 CPUs=4 RealMemory=7836 State=UNKNOWN" in lines
    assert "PartitionName=lab Nodes=ant,bee Default=YES MaxTime=INFINITE State=UP AllowGroups=lab" in lines
    assert "DisableRootJobs=YES" in lines
    assert "ProctrackType=proctrack/linuxproc" in lines and "TaskPlugin=task/none" in lines
    assert not [ln for ln in lines if "{" in ln or "}" in ln]


def test_run_user_read_from_id_and_a_uid_or_gid_that_differs_between_nodes_is_one_message():
    me = owner.slurm_run_user("uid=1000(lab) gid=1000(lab) groups=1000(lab),27(sudo)")
    assert me == {"uid": 1000, "user": "lab", "gid": 1000, "group": "lab"}
    same = {"a": {"slurm_id": me}, "b": {"slurm_id": dict(me)}}
    assert owner.slurm_owner_problem(["a", "b"], same) == ""
    other_gid = {**same, "c": {"slurm_id": {**me, "gid": 1777}}}
    msg = owner.slurm_owner_problem(["a", "b", "c"], other_gid)
    assert msg.startswith("ddplab: error: the run user differs between a and c: lab is uid 1000 gid 1000 "
                          "on a, lab is uid 1000 gid 1777 on c.")
    assert "(as root on c: groupmod -g 1000 lab; usermod -g 1000 lab)" in msg and "slurm.yml again" in msg
    assert owner.slurm_run_user("uid=1000(lab) gid=1777 groups=1777") == {**me, "gid": 1777, "group": "1777"}
    assert "uid 1001 gid 1000 on b" in owner.slurm_owner_problem(["a", "b"], {**same, "b": {"slurm_id": {
        **me, "uid": 1001}}})
    assert owner.slurm_allow_groups("", me) == "lab" and owner.slurm_allow_groups("lab,ta", me) == "lab,ta"
    with pytest.raises(AnsibleFilterError, match="not uid=N"):
        owner.slurm_run_user("id: cannot find name for user ID 1000")


def test_lab_tag_tells_lab_folders_and_masters_apart_and_prefixes_the_job_names():
    from ddplab.lab_tag import lab_tag, secrets_dir, slurm_job_prefix
    tag = lab_tag("10.0.0.1", "~/ddplab")
    assert re.fullmatch(r"[0-9a-f]{8}", tag) and tag == lab_tag("10.0.0.1", "~/ddplab")
    assert len({tag, lab_tag("10.0.0.1", "~/ddplab2"), lab_tag("10.0.0.2", "~/ddplab")}) == 3
    assert slurm_job_prefix(tag) == f"ddplab-{tag}-"
    assert secrets_dir("", tag, "/home/me") == f"/home/me/.config/ddplab/{tag}"
    assert secrets_dir("~/keys/lab", tag, "/home/me") == "/home/me/keys/lab"
    assert secrets_dir("/srv/keys", tag, "/home/me") == "/srv/keys"


def test_secrets_folder_is_0700_and_an_old_key_of_ours_moves_in_once(tmp_path):
    from ddplab.errors import DdplabError
    from ddplab.secrets import secrets
    old = tmp_path / "runs" / ".slurm" / "munge.key"
    old.parent.mkdir(parents=True)
    old.write_text("k" * 64)
    old.chmod(0o600)
    folder = tmp_path / "config" / "ddplab" / "abcd1234"
    out = secrets(folder, [(old, "munge.key")])
    assert out["made"] and out["moved"] == [f"{old} -> {folder / 'munge.key'}"] and out["left"] == []
    assert (folder / "munge.key").read_text() == "k" * 64 and not old.parent.exists()
    for path in (folder, folder.parent, folder.parent.parent):
        assert path.stat().st_mode & 0o777 == 0o700, path
    again = secrets(folder, [(old, "munge.key")])
    assert again == {"dir": str(folder), "made": False, "moved": [], "left": []}
    # a symlink at the old place is not ours to move: left, and said
    old.parent.mkdir()
    old.symlink_to(tmp_path / "elsewhere")
    other = tmp_path / "other-lab"
    assert secrets(other, [(old, "munge.key")])["left"] == [f"{old} is not a plain file of yours; "
                                                           f"{other / 'munge.key'} is made anew"]
    assert old.is_symlink() and not (other / "munge.key").exists()
    folder.chmod(0o755)
    with pytest.raises(DdplabError, match=r"mode 0755: others may read the lab's keys; run `chmod 700 "):
        secrets(folder, [])


def test_daemon_specs_restart_only_what_read_the_changed_file():
    daemons_var = [
        {"name": "munged", "pidfile": "/run/munge/munged.pid", "argv": ["munged"], "changed_by": ["key"]},
        {"name": "slurmd", "pidfile": "/run/slurmd.pid", "argv": ["slurmd"], "changed_by": ["key", "conf"]}]
    assert [d["restart"] for d in conf.slurm_daemon_specs(daemons_var, False, True)] == [False, True]
    assert [d["restart"] for d in conf.slurm_daemon_specs(daemons_var, True, False)] == [True, True]
    assert [d["restart"] for d in conf.slurm_daemon_specs(daemons_var, False, False)] == [False, False]


def test_missing_packages_are_those_dpkg_does_not_list_as_installed():
    lines = ["installed munge", "not-installed slurmd", "config-files slurm-client", ""]  # slurmctld: unknown
    assert conf.slurm_missing_packages(lines, ["munge", "slurmd", "slurm-client", "slurmctld"]) == \
        ["slurmd", "slurm-client", "slurmctld"]
    assert conf.slurm_missing_packages(["installed munge", "installed slurmd"], ["munge", "slurmd"]) == []


SCONTROL = [f"NodeName=node{i} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 NodeAddr=10.77.7.1{i} "
            f"NodeHostName=node{i} State=IDLE" for i in (0, 1)]


def test_job_data_matches_inventory_nodes_to_slurm_names_by_address():
    hv = {"m": {"ddplab_run_dir": "/home/lab/ddplab/runs/r"}, "w": {"ddplab_run_dir": "/srv/lab/runs/r"}}
    addrs = {"m": "10.77.7.10", "w": "10.77.7.11"}
    data = job.slurm_job(["w", "m"], hv, addrs, job.slurm_node_addrs(SCONTROL))
    assert data["names"] == "node0,node1" and data["count"] == 2
    assert [(n["host"], n["name"], n["run_dir"]) for n in data["nodes"]] == [
        ("m", "node0", "/home/lab/ddplab/runs/r"), ("w", "node1", "/srv/lab/runs/r")]
    with pytest.raises(AnsibleFilterError,
                       match=r"w \(10.77.7.99\) is not a node of the Slurm cluster.*slurm.yml"):
        job.slurm_job(["m", "w"], hv, {**addrs, "w": "10.77.7.99"}, job.slurm_node_addrs(SCONTROL))


def test_squeue_state_is_the_newest_job_of_the_run_or_none():
    assert job.slurm_squeue_state(["7|COMPLETED|None|node[0-1]", "12|PENDING|Resources|"]) == \
        {"job": "12", "state": "PENDING", "reason": "Resources", "nodes": ""}
    assert job.slurm_squeue_state([])["state"] == "NONE"
    # a job slurmctld has not looked at yet: Slurm's reason "None" is no reason to show
    assert job.slurm_squeue_state(["13|PENDING|None|"])["reason"] == ""


@pytest.mark.parametrize(("job_state", "want"), [
    ("PENDING", "queued"), ("RUNNING", "running"), ("COMPLETING", "running"), ("NODE_FAIL", "lost"),
    ("CANCELLED", "lost"), ("NONE", "lost")])
def test_a_slurm_rank_without_exit_code_takes_its_state_from_the_job(job_state, want):
    assert alive_state(None, job_state) == want


def test_a_tmux_rank_still_takes_its_state_from_the_pane():
    assert alive_state({"dead": False, "pid": 1}, "") == "running"
    assert alive_state({"dead": True, "pid": 1}, "") == "lost"


def _sleeper(tmp_path: Path) -> dict:
    pidfile = tmp_path / "sleep.pid"
    return {"name": "sleep", "pidfile": str(pidfile), "restart": False,
            "argv": ["sh", "-c", f"sleep 60 >/dev/null 2>&1 & echo $! > {pidfile}"]}


def test_daemons_start_once_then_restart_by_their_own_pid_file(tmp_path):
    d = _sleeper(tmp_path)
    try:
        assert daemons.ensure([d]) == {"started": ["sleep"], "restarted": [], "running": []}
        first = daemons.pid_of("sleep", d["pidfile"])
        assert first is not None
        assert daemons.ensure([d]) == {"started": [], "restarted": [], "running": ["sleep"]}
        again = daemons.ensure([{**d, "restart": True}])
        assert again == {"started": [], "restarted": ["sleep"], "running": []}
        second = daemons.pid_of("sleep", d["pidfile"])
        assert second not in (None, first)
        assert daemons.pid_of("sleep", d["pidfile"]) != first  # the old one was ended
    finally:
        pid = daemons.pid_of("sleep", d["pidfile"])
        if pid:
            os.kill(pid, signal.SIGKILL)


def test_a_pid_file_naming_another_program_is_not_the_daemon(tmp_path):
    pidfile = tmp_path / "x.pid"
    pidfile.write_text(f"{os.getpid()}\n")  # this pytest process, not a `sleep`
    assert daemons.pid_of("sleep", str(pidfile)) is None


def test_a_daemon_that_does_not_come_up_is_named_with_its_words(tmp_path, capsys):
    spec = {"daemons": [{"name": "sleep", "pidfile": str(tmp_path / "none.pid"),
                         "argv": ["sh", "-c", "echo 'fatal: no config' >&2; exit 1"],
                         "log": "/var/log/x.log"}]}
    assert daemons.main([], json.dumps(spec)) == 1
    err = json.loads(capsys.readouterr().out)["error"]
    assert "sleep did not start" in err and "fatal: no config" in err and "/var/log/x.log" in err


def test_daemons_reads_its_spec_after_its_program_on_stdin(tmp_path):
    """As ddplab_node runs it (roles/slurm): the program, then its spec, on stdin, as every verb shipped
    alone (nothing of the spec on the node's argv); a bad spec is one JSON error line, no traceback."""
    argv, program = nodeprobe_command("daemons", [], sys.executable)
    d = _sleeper(tmp_path)
    try:
        proc = subprocess.run(argv, input=program + json.dumps({"daemons": [d]}) + "\n", capture_output=True,
                              text=True, timeout=60)
        assert (proc.returncode, json.loads(proc.stdout)) == (0, {"started": ["sleep"], "restarted": [],
                                                                  "running": []}), proc.stderr
    finally:
        pid = daemons.pid_of("sleep", d["pidfile"])
        if pid:
            os.kill(pid, signal.SIGKILL)
    for bad in ("{", '{"daemons": {"name": "sleep"}}'):
        proc = subprocess.run(argv, input=program + bad, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and proc.stderr == "", proc.stderr
        assert json.loads(proc.stdout)["error"].startswith("daemons: the spec"), proc.stdout


def test_settings_refuse_elastic_under_slurm_with_one_message():
    from ddplab.settings import inputs
    base = {"ddplab_scheduler": "slurm", "ddplab_elastic": True, "ddplab_srun_ports": "60001-60100"}
    (problem,) = inputs.scheduler(base)
    assert problem.subject == "ddplab_elastic" and "ddplab_scheduler: none" in problem.fix
    assert inputs.scheduler({**base, "ddplab_elastic": False}) == []
    assert inputs.scheduler({**base, "ddplab_scheduler": "none"}) == []
    (ports,) = inputs.scheduler({**base, "ddplab_elastic": False, "ddplab_srun_ports": "70000-70100"})
    assert ports.subject == "ddplab_srun_ports"


def test_a_run_on_part_of_the_lab_is_a_slurm_run_of_at_most_the_labs_nodes():
    from ddplab.settings import inputs
    base = {"ddplab_scheduler": "slurm", "ddplab_slurm_nodes": 2}
    assert inputs.slurm_nodes(base, 3) == []
    assert inputs.slurm_nodes({**base, "ddplab_slurm_nodes": 0}, 3) == []
    (tmux,) = inputs.slurm_nodes({**base, "ddplab_scheduler": "none"}, 3)
    assert tmux.subject == "ddplab_slurm_nodes" and "ddplab_scheduler: slurm" in tmux.fix
    (many,) = inputs.slurm_nodes({**base, "ddplab_slurm_nodes": 4}, 3)
    assert many.found == "4 but the lab has 3 nodes" and "3 or fewer" in many.fix


# The munge key task's content, rendered by Ansible's templar in a child process (importing ansible here
# patches sys.intern for the rest of this pytest process, tests/slurm/test_export_sbatch.py).
RENDER_MUNGE_KEY = """
import json, sys, yaml
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template
init_plugin_loader()
tasks = yaml.safe_load(open(sys.argv[1] + "/roles/slurm/tasks/main.yml"))
task = next(t for t in tasks if t["name"].startswith("Give every node the lab's munge key"))
templar = Templar(loader=DataLoader(), variables=json.loads(sys.argv[2]))
print(templar.template(trust_as_template(task["ansible.builtin.copy"]["content"])))
"""


def munge_key_content(key_file: Path, check_mode: bool) -> str:
    variables = {"slurm_munge_key_file": str(key_file), "ansible_check_mode": check_mode}
    return subprocess.run([sys.executable, "-c", RENDER_MUNGE_KEY, str(REPO), json.dumps(variables)],
                          capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def test_check_mode_makes_no_munge_key_and_a_real_run_makes_it_once(tmp_path):
    key_file = tmp_path / ".slurm" / "munge.key"
    stand_in = munge_key_content(key_file, check_mode=True)
    assert not key_file.exists() and not key_file.parent.exists()  # --check wrote nothing
    key = munge_key_content(key_file, check_mode=False)
    assert re.fullmatch(r"[A-Za-z0-9]{64}", key) and key != stand_in
    assert key_file.read_text().strip() == key and key_file.stat().st_mode & 0o077 == 0
    # once made, --check and later runs read the same key
    assert munge_key_content(key_file, check_mode=True) == key == munge_key_content(key_file, False)
