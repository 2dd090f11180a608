"""`python -m ddplab export sbatch` without Slurm: the script is rendered from a test inventory, passes
`bash -n`, carries the tmux path's trainer argv, and its two checks (the torch pin, the shards against the
manifest) run for real through `bash SCRIPT check-only` with a Python that has the pinned torch and one
that has none, on a shard set made by trainer.data and a copy of it that was changed. The srun part runs
on a real Slurm in tests/stock/test_slurm.py."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.playbooks import make_shards

REPO = Path(__file__).resolve().parents[2]
PIN = "2.13.0"


def ddplab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddplab", *args], cwd=REPO, text=True, capture_output=True,
                          timeout=120)


def inventory(tmp: Path, shards: Path, **settings) -> Path:
    inv = tmp / "inv"
    (inv / "group_vars" / "all").mkdir(parents=True)
    hosts = {"ddplab_nodes": {"children": {
        "ddplab_master": {"hosts": {"box-a": {"ddplab_node_rank": 0, "ansible_host": "10.9.0.1"}}},
        "ddplab_workers": {"hosts": {"box-b": {"ddplab_node_rank": 1, "ansible_host": "10.9.0.2"},
                                     "box-c": {"ddplab_node_rank": 2, "ansible_host": "10.9.0.3"}}}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    values = {"ddplab_data_dir": str(shards), "ddplab_torch_version": PIN, "ddplab_trainer_steps": 7,
              "ddplab_run_id": "exp-1", "ddplab_env": {"LAB_NOTE": "it's a test"}, **settings}
    (inv / "group_vars" / "all" / "ddplab.yml").write_text(yaml.safe_dump(values))
    return inv


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return make_shards(tmp_path_factory.getbasetemp() / "shards")


@pytest.fixture
def exported(tmp_path, shards):
    """(script, cluster root): the script for a 3-node inventory, the shards copied to ROOT/data."""
    root = tmp_path / "cluster"
    shutil.copytree(shards, root / "data")
    script = tmp_path / "job.sbatch"
    proc = ddplab("export", "sbatch", "-i", str(inventory(tmp_path, shards)), "-o", str(script),
                  "--root", str(root), "--python", sys.executable, "--time", "00:30:00")
    assert proc.returncode == 0, proc.stderr
    return script, root


def check_only(script: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(script.parent)}  # no SLURM_* and no venv on PATH
    return subprocess.run(["bash", str(script), "check-only"], text=True, capture_output=True, timeout=300,
                          env=env)


# Ansible's templar runs in a child process: importing ansible patches sys.intern, which breaks a later
# torch._dynamo import in this pytest process (as tests/settings/test_inputs.py does).
RENDER_LAUNCH_SH = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader
from ansible.template import Templar, trust_as_template
lookup_loader.add_directory(sys.argv[1] + "/plugins/lookup")  # ddplab_launch_command
loader = DataLoader()
role_vars = loader.load_from_file(sys.argv[1] + "/roles/launch/vars/main.yml", trusted_as_template=True)
templar = Templar(loader=loader, variables={**role_vars, **json.loads(sys.argv[2])})
print(templar.template(trust_as_template(open(sys.argv[1] + "/roles/launch/templates/launch.sh.j2").read())))
"""


def launch_sh_trainer_argv(root: Path) -> str:
    """What the tmux path's launch.sh.j2 gives torchrun after its own flags, for the same run."""
    lab = {"data": f"{root}/data", "pythonpath": f"{root}/code"}
    variables = {"ansible_managed": "", "ddplab_run": "exp-1", "inventory_hostname": "box-a",
                 "ddplab_node_rank": 0, "ddplab_run_dir": f"{root}/runs/exp-1", "ddplab_rank_cwd": "/x",
                 "ddplab_lab": lab, "ddplab_byo": False, "ddplab_elastic": False, "ddplab_balance": False,
                 "ddplab_shard": False,
                 "ddplab_trainer_steps": 7, "ddplab_trainer_depth": 2, "ddplab_pg_timeout": 45,
                 "ddplab_trainer_extra_args": [], "ddplab_rdzv_timeout": 60, "ddplab_max_restarts": 0,
                 "ddplab_code_dir": "", "ddplab_entrypoint": "", "ddplab_entrypoint_args": [],
                 "launch_rank_python": "python"}
    text = subprocess.run([sys.executable, "-c", RENDER_LAUNCH_SH, str(REPO), json.dumps(variables)],
                          capture_output=True, text=True, timeout=60, check=True).stdout
    return re.search(r"--max-restarts 0 \\\n\s+(.*?) --threads", text).group(1)


def test_script_passes_bash_n_and_runs_the_tmux_paths_trainer_argv(exported):
    script, root = exported
    text = script.read_text()
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    sbatch = re.findall(r"^#SBATCH (\S+)$", text, re.M)
    assert sbatch == ["--job-name=ddplab-exp-1", "--nodes=3", "--ntasks-per-node=1", "--exclusive",
                      "--no-requeue", "--time=00:30:00"]
    argv = re.search(r"^DDPLAB_TRAINER_ARGV=\((.*)\)$", text, re.M).group(1)
    assert argv == launch_sh_trainer_argv(root)
    assert shlex.split(argv)[:3] == ["-m", "trainer", "--data"] and "--steps 7" in argv
    assert "export LAB_NOTE='it'\"'\"'s a test'" in text  # ddplab_env, quoted once
    assert "scontrol show hostnames \"$SLURM_JOB_NODELIST\"" in text and "srun" in text


def test_each_local_rank_compiles_into_a_folder_of_its_own(exported, tmp_path):
    """Each node's rank group writes the launch role's rank_python (torchrun's PYTHON_EXEC) into the run
    folder under its own name (the root may be shared or each node's own); each node's ranks compile under
    ROOT/compile-cache/<host>/local<LOCAL_RANK>."""
    script, root = exported
    text = script.read_text()
    wrapper = re.search(r"<<'(DDPLAB_RANK_PYTHON_*)'\n(.*?)^\1$", text, re.M | re.S).group(2)
    assert 'local wrapper="$DDPLAB_RUN_DIR/rank_python-$DDPLAB_HOST"' in text
    assert 'PYTHON_EXEC="$wrapper"' in text
    assert f"export DDPLAB_COMPILE_CACHE={root}/compile-cache/\"$DDPLAB_HOST\"" in text
    (tmp_path / "rank_python").write_text(wrapper)
    cache = tmp_path / "compile-cache" / "box-b"
    env = {"PATH": "/usr/bin:/bin", "LOCAL_RANK": "1", "DDPLAB_COMPILE_CACHE": str(cache)}
    out = subprocess.run(["sh", str(tmp_path / "rank_python"), "-c",
                          "import os, sys; print(os.environ['TORCHINDUCTOR_CACHE_DIR'], sys.executable)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == [f"{cache}/local1", sys.executable]
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700


def test_check_only_passes_with_the_pinned_torch_and_the_manifests_shards(exported):
    proc = check_only(exported[0])
    assert proc.returncode == 0, proc.stderr
    assert re.search(rf"ddplab: torch {PIN}\S* in {re.escape(sys.executable)}", proc.stdout), proc.stdout
    assert re.search(r"ddplab: data: \d+ shards in .*/cluster/data match the manifest", proc.stdout), \
        proc.stdout


def test_a_python_without_the_pinned_torch_stops_the_job_with_the_fix(exported, tmp_path):
    script, _ = exported
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = tmp_path / "bare" / "bin" / "python"
    text = script.read_text().replace(f"DDPLAB_PYTHON={sys.executable}\n", f"DDPLAB_PYTHON={bare}\n")
    script.write_text(text)
    proc = check_only(script)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddplab: error: torch (") and "no torch" in lines[0], lines
    assert f"{bare} -m pip install torch=={PIN} --index-url https://download.pytorch.org/whl/cpu" in lines[0]
    assert "ddplab: data:" not in proc.stdout  # it stops at the first failed check


def test_a_changed_an_extra_or_a_missing_shard_stops_the_job(exported):
    script, root = exported
    shard = sorted((root / "data").glob("*.parquet"))[0]
    extra = root / "data" / "shard_99999.parquet"
    shutil.copy(shard, extra)
    with open(shard, "ab") as f:
        f.write(b"x")
    for found in (f"extra {extra.name}; changed {shard.name}", f"missing {shard.name}"):
        proc = check_only(script)
        assert proc.returncode == 2
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("ddplab: error: data ("), lines
        assert f"does not hold the manifest's shards: {found}; copy " in lines[0], lines
        shard.unlink(missing_ok=True)
        extra.unlink(missing_ok=True)


def test_outside_a_slurm_job_it_runs_nothing_after_the_checks(exported):
    script, _ = exported
    proc = subprocess.run(["bash", str(script)], text=True, capture_output=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "SLURM_JOB_ID is not set: submit with sbatch" in proc.stderr
    assert not (exported[1] / "runs").exists()


@pytest.mark.parametrize("case", ["relative-root", "bad-time", "users-file", "elastic"])
def test_bad_input_is_one_line_exit_2_and_nothing_written(case, tmp_path, shards):
    inv = inventory(tmp_path, shards, **({"ddplab_elastic": True} if case == "elastic" else {}))
    out = tmp_path / "job.sbatch"
    args = ["export", "sbatch", "-i", str(inv), "-o", str(out), "--root", "/shared/lab"]
    if case == "relative-root":
        args[-1] = "lab"
    if case == "bad-time":
        args += ["--time", "90 minutes"]
    if case == "users-file":
        out.write_text("#!/bin/bash\n# mine\n")
    proc = ddplab(*args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddplab: error: "), lines
    expect = {"relative-root": "--root 'lab': not an absolute path", "bad-time": "--time '90 minutes'",
              "users-file": "was not written by ddplab export", "elastic": "ddplab_elastic (all)"}[case]
    assert expect in lines[0]
    assert (out.read_text() == "#!/bin/bash\n# mine\n") if case == "users-file" else not out.exists()


def first_word(text: str) -> str:
    """The first shell word of text, as bash reads it (the rest of the script is not parsed)."""
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split = True
    return lex.get_token()


def test_the_script_keeps_ddplab_env_secrets_0600(tmp_path, shards):
    """ddplab_env's values (a multi-line key, quotes, `=`) are in the script, which is 0600 (it was 0755; a
    re-export replaces such a file with a 0600 one). bash reads it without the exec bit (the check-only
    tests above run 0600 scripts), and so does sbatch."""
    secret = "-----BEGIN KEY-----\nabc='d=e'\n-----END KEY-----"
    inv = inventory(tmp_path, shards, ddplab_env={"DEPLOY_KEY": secret, "LAB_NOTE": "it's a test"})
    script = tmp_path / "job.sbatch"
    args = ["export", "sbatch", "-i", str(inv), "--root", "/shared/lab"]
    to_stdout = ddplab(*args, "-o", "-")
    assert to_stdout.returncode == 0 and first_word(to_stdout.stdout.split("DEPLOY_KEY=", 1)[1]) == secret
    assert "ddplab: note: the script holds the values of ddplab_env; keep" in to_stdout.stderr
    script.write_text(to_stdout.stdout)
    script.chmod(0o755)  # as the former export wrote it
    proc = ddplab(*args, "-o", str(script))
    assert proc.returncode == 0, proc.stderr
    assert script.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".job.sbatch")] == []
    assert first_word(script.read_text().split("export DEPLOY_KEY=", 1)[1]) == secret
