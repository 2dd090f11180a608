"""A training repository run as it is (issue 13) on 2 simulated hosts.

The repository is made in the test, shaped like a real one (tests/byo/fixtures/tiny_repo: nanoGPT's
layout): `train.py config/tiny.py --steps=4` exec's `configurator.py` and reads `data/tiny/train.bin` by
paths relative to its working directory, the data is git-ignored (shipped by ddplab_code_include), and
outputs go to the relative folder `out-tiny/`. It trains across 2 hosts from its synced folder; a second
launch keeps the first run's outputs on the nodes and prunes only a file ddplab placed that left the
control host; the run folder as working directory fails with the exception named in the outcome.
"""

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.playbooks import playbook, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny_repo"
HOSTS = ("node0", "node1")
USER = "/root/ddplab/code/user"


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, text=True,
                          timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """The fixture repository committed to git, plus its git-ignored prepared data (9 kB of bytes)."""
    root = tmp_path_factory.mktemp("tiny-repo")
    shutil.copytree(FIXTURE, root, dirs_exist_ok=True)
    (root / "old_helper.py").write_text("# a module the user deletes later\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny")
    (root / "data" / "tiny").mkdir(parents=True)
    (root / "data" / "tiny" / "train.bin").write_bytes(bytes((i * 37 + 11) % 251 for i in range(9000)))
    assert git(root, "status", "--porcelain") == ""  # the data is ignored: git alone would never ship it
    return root


@pytest.fixture(scope="module")
def lab(tmp_path_factory, repo):
    return {"ddplab_data_dir": "", "ddplab_runs_dir": tmp_path_factory.mktemp("repo-runs"),
            "ddplab_code_dir": repo, "ddplab_entrypoint": "train.py", "ddplab_threads": 1,
            # the ranks themselves are under test here (outputs, a failing rank's outcome); the smoke run
            # before them is tested in test_byo_simlan.py and tests/nodeprobe/test_code_smoke.py
            "ddplab_smoke_run": "false",
            "ddplab_wait_poll": 10, "ddplab_rdzv_timeout": 30}


MORE = {"ddplab_entrypoint_args": ["config/tiny.py", "--steps=4"], "ddplab_code_include": ["data/**/*.bin"],
        "ddplab_collect_globs": ["out-tiny/*.json", "out-tiny/*.log"]}


def launch(cluster, lab, run_id, **more):
    extra = {**lab, "ddplab_wait": "true", "ddplab_run_id": run_id}
    return playbook("launch.yml", "-e", json.dumps({**MORE, **more}), inventory=cluster.inventory_dir,
                    timeout=600, extra=extra)


def node_text(cluster, host, path):
    return cluster.exec(host, ["cat", path], timeout=30, check=True).stdout


@pytest.fixture(scope="module")
def first_run(simlan_cluster, lab):
    cluster = simlan_cluster(2, fresh=True)
    yield cluster, launch(cluster, lab, "tiny-1")
    # ufw enabled, lab folders written: the next module gets fresh hosts, also when a test here failed
    simlan_cluster.discard()


def test_the_repository_trains_across_two_hosts_from_its_folder(first_run, lab, repo):
    cluster, proc = first_run
    assert proc.returncode == 0, tail(proc)
    run = lab["ddplab_runs_dir"] / "tiny-1"
    result = json.loads((run / "node0" / "out-tiny" / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 4 and result["identical"] is True
    assert result["rows"] == 1000 and result["losses"][-1] < result["losses"][0]
    data_sha = hashlib.sha256((repo / "data" / "tiny" / "train.bin").read_bytes()).hexdigest()
    for host, rank in zip(HOSTS, (0, 1), strict=True):
        log = (run / host / "launch.log").read_text()
        assert f"tiny rank {rank}/2 steps 4" in log and f"cwd {USER}" in log  # the synced folder
        assert "Overriding config with config/tiny.py" in log
        assert (run / host / "out-tiny" / "history.log").read_text() == f"tiny-1 rank {rank}\n"
        shipped = cluster.exec(host, ["sha256sum", f"{USER}/data/tiny/train.bin"], timeout=30, check=True)
        assert shipped.stdout.split()[0] == data_sha  # git-ignored, shipped by ddplab_code_include
    assert cluster.exec("node0", ["test", "-s", f"{USER}/out-tiny/ckpt.pt"], timeout=30).returncode == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["code_identical"] is True and summary["all_exited_zero"] is True
    # the lines the code printed (nanoGPT's iter line, rank 0 only) give the report and the progress
    assert summary["metrics_from"] == "launch.log (nanogpt lines)" and summary["last_step"] == 3
    assert summary["loss_last"] == float(f"{result['losses'][-1]:.4f}") and summary["tokens_per_sec"] > 0
    assert [r["last_step"] for r in summary["ranks"]] == [3, None] and (run / "loss.png").is_file()
    assert "step 3 loss " in proc.stdout and "step -/" not in proc.stdout  # no built-in trainer's total


def test_a_second_launch_keeps_the_outputs_and_prunes_only_what_ddplab_placed(first_run, lab, repo):
    cluster, first = first_run
    assert first.returncode == 0, tail(first)
    cluster.exec("node1", ["bash", "-c", f"echo mine > {USER}/out-tiny/notes.txt"], timeout=30, check=True)
    git(repo, "rm", "-q", "old_helper.py")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "drop the old helper")
    proc = launch(cluster, lab, "tiny-2")
    assert proc.returncode == 0, tail(proc)
    for host, rank in zip(HOSTS, (0, 1), strict=True):
        history = node_text(cluster, host, f"{USER}/out-tiny/history.log")
        assert history == f"tiny-1 rank {rank}\ntiny-2 rank {rank}\n"  # the first run's output is still there
        gone = cluster.exec(host, ["test", "-e", f"{USER}/old_helper.py"], timeout=30)
        assert gone.returncode != 0  # ddplab placed it and it left the control host: removed
    assert node_text(cluster, "node1", f"{USER}/out-tiny/notes.txt") == "mine\n"
    assert cluster.exec("node0", ["test", "-s", f"{USER}/out-tiny/ckpt.pt"], timeout=30).returncode == 0
    # preflight's code parity counts only the files ddplab placed: the outputs do not make the copy differ
    check = playbook("preflight.yml", "-e", json.dumps(MORE), inventory=cluster.inventory_dir, timeout=300,
                     extra={k: v for k, v in lab.items() if k.startswith("ddplab_") and "wait" not in k})
    assert check.returncode == 0, tail(check)


def test_a_changed_data_file_fails_preflight_naming_the_node(first_run, lab):
    cluster, first = first_run
    assert first.returncode == 0, tail(first)
    cluster.exec("node1", ["bash", "-c", f"echo x >> {USER}/data/tiny/train.bin"], timeout=30, check=True)
    extra = {k: v for k, v in lab.items() if "wait" not in k}
    check = playbook("preflight.yml", "-e", json.dumps(MORE), inventory=cluster.inventory_dir, timeout=300,
                     extra=extra)
    assert check.returncode != 0, tail(check)
    verdict = json.loads((lab["ddplab_runs_dir"] / "preflight" / "latest.json").read_text())
    assert verdict["hosts"]["node1"]["code"]["status"] == "FAIL"
    assert verdict["hosts"]["node0"]["code"]["status"] == "ok"
    fixed = playbook("prepare.yml", "--tags", "code", "-e", json.dumps(MORE), inventory=cluster.inventory_dir,
                     timeout=300, extra=extra)
    assert fixed.returncode == 0, tail(fixed)


def test_the_run_folder_as_working_directory_fails_and_says_why(first_run, lab):
    cluster, first = first_run
    assert first.returncode == 0, tail(first)
    proc = launch(cluster, lab, "tiny-run-dir", ddplab_workdir="run")
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    want = "FileNotFoundError: [Errno 2] No such file or directory: 'configurator.py' (train.py:"
    assert f"ddplab: error: rank 0 on node0 exited with code 1: {want}" in out, tail(proc)
    assert f"ddplab: error: rank 1 on node1 exited with code 1: {want}" in out
