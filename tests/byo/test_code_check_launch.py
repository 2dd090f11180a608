"""The CPU check in the playbooks (local inventory, no root): with the smoke run off, a nanoGPT-shaped
train.py that calls torch.cuda.set_device under DDP is refused on the control host before any node
changes, naming the file and line; ddplab_code_check=false skips the scan and the same code is synced.
With the smoke run on (the default) the same code is run as 2 CPU ranks on the master before any rank
starts, and refused at the line where it crashed, with the scan's hint for that line."""

import shutil
from pathlib import Path

import pytest

from tests.helpers.playbooks import playbook, tail
from tests.helpers.trainer_runs import free_port

pytestmark = pytest.mark.slow

GPTLIKE = Path(__file__).resolve().parents[1] / "control" / "code_fixtures" / "gptlike"


def line_of(path: Path, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(path.read_text().splitlines()) if needle in ln)


def test_code_that_fails_on_cpu_is_refused_before_any_node_changes(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code = tmp_path / "gpt"
    shutil.copytree(GPTLIKE, code)
    extra = {"ddplab_code_dir": code, "ddplab_entrypoint": "train.py", "ddplab_data_dir": "",
             "ddplab_master_port": free_port(),  # other tests on this machine use 29500 too
             "ddplab_runs_dir": tmp_path / "runs", "ddplab_smoke_run": "false"}
    proc = playbook("launch.yml", extra=extra, timeout=300, env={"HOME": str(home)})
    assert proc.returncode != 0, tail(proc)
    out = proc.stdout + proc.stderr
    set_device = line_of(code / "train.py", "torch.cuda.set_device(device)")
    device_ids = line_of(code / "train.py", "device_ids=[ddp_local_rank]")
    assert f"ddplab: error: train.py:{set_device}: torch.cuda.set_device(device)" in out, tail(proc)
    assert f"ddplab: error: train.py:{device_ids}: DDP(model, device_ids=[ddp_local_rank])" in out
    assert "the launch is refused before any rank starts" in out
    assert not (home / "ddplab").exists()  # no lab folder, no code, no rank: nothing on the node changed

    skipped = playbook("prepare.yml", "--tags", "code", extra={**extra, "ddplab_code_check": "false"},
                       timeout=300, env={"HOME": str(home)})
    assert skipped.returncode == 0, tail(skipped)
    assert "Scan the user's code" not in skipped.stdout
    for lab in ("local0", "local1"):
        synced = home / "ddplab" / lab / "code" / "user" / "train.py"
        assert synced.read_bytes() == (code / "train.py").read_bytes()


def test_the_smoke_run_refuses_code_that_crashes_on_cpu_at_its_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    code = tmp_path / "gpt"
    shutil.copytree(GPTLIKE, code)
    extra = {"ddplab_code_dir": code, "ddplab_entrypoint": "train.py", "ddplab_data_dir": "",
             "ddplab_master_port": free_port(),  # other tests on this machine use 29500 too
             "ddplab_runs_dir": tmp_path / "runs", "ddplab_run_id": "smoke-refused"}
    proc = playbook("launch.yml", extra=extra, timeout=600, env={"HOME": str(home)})
    assert proc.returncode != 0, tail(proc)
    out = proc.stdout + proc.stderr
    init = line_of(code / "train.py", "init_process_group(backend=backend)")
    assert "the smoke run of your code before the ranks start decides" in out  # the scan no longer refuses
    assert "ddplab: error: the smoke run of train.py on local0 (2 CPU ranks over loopback" in out, tail(proc)
    assert f"NCCL built in at train.py:{init}; patch: " in out, tail(proc)
    assert f"; the CPU check: train.py:{init}: " in out
    for lab in ("local0", "local1"):
        root = home / "ddplab" / lab
        assert not (root / "runs" / "smoke-refused").exists()  # no rank started, the scratch copy is gone
        synced = sorted(p.name for p in (root / "code" / "user").iterdir())
        assert synced == sorted(p.name for p in code.iterdir())  # nothing the smoke run wrote
