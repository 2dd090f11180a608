"""Issue 19's table through Ansible, on the local inventory (no root, no SSH): each bad input fails in the
validation play with its one message, no later play starts, and no lab folder or run folder appears.

HOME points at a temp folder, so each inventory host's lab folder (~/ddplab/local0, ~/ddplab/local1) would
be created there by the first task that touches a node; it must not exist afterwards. The real
~/ddplab/local0 and local1 are snapshot before and after as well. Each row's time from command to message is
printed (run with -s to see them and their median)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from settings_helpers import REPO, shards  # noqa: F401

from ddplab.settings import external

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
TIMES: dict[str, float] = {}
REAL_LABS = [Path.home() / "ddplab" / "local0", Path.home() / "ddplab" / "local1"]


def snapshot(paths: list[Path]) -> dict:
    out = {}
    for root in paths:
        for p in sorted(root.rglob("*")) if root.exists() else []:
            if p.is_file() and not p.is_symlink():
                st = p.stat()
                out[str(p)] = (st.st_mtime_ns, st.st_size, p.read_bytes() if st.st_size < 1 << 20 else b"")
            else:
                out[str(p)] = "dir" if p.is_dir() else "other"
    return out


@pytest.fixture
def lab(tmp_path, shards):  # noqa: F811
    """A temp HOME and runs folder, a copy of the shards and a code folder with train.py."""
    home, runs, data, code = (tmp_path / n for n in ("home", "runs", "data", "code"))
    home.mkdir()
    shutil.copytree(shards, data)
    code.mkdir()
    (code / "train.py").write_text("print('hi')\n")
    return {"home": home, "runs": runs, "data": data, "code": code, "tmp": tmp_path}


def play(lab, *args, playbook="launch.yml", inventory=None):
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{playbook}", "-e", "ddplab_wait=true",
            "-e", f"ddplab_runs_dir={lab['runs']}", "-e", f"ddplab_data_dir={lab['data']}", *args]
    if inventory:
        argv += ["-i", str(inventory)]
    env = {**os.environ, "HOME": str(lab["home"]), "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return proc, time.monotonic() - start


def _not_json(lab):
    (lab["data"] / "manifest.json").write_text("{files: [")
    return [], f"{lab['data']}/manifest.json (control host): not JSON"


def _unsafe_manifest(lab):
    m = json.loads((lab["data"] / "manifest.json").read_text())
    m["files"][0]["file"] = "../" + m["files"][0]["file"]
    (lab["data"] / "manifest.json").write_text(json.dumps(m))
    bad = m["files"][0]["file"]
    return [], f"{lab['data']}/manifest.json (control host): manifest entry {bad!r} is not a plain file name"


def _changed_shard(lab):
    shard = sorted(lab["data"].glob("*.parquet"))[0]
    shard.write_bytes(shard.read_bytes()[:-1])
    return [], f"{lab['data']}/manifest.json (control host): sha256 of {shard.name} differs"


def _missing_group(lab):
    inv = lab["tmp"] / "inv"
    inv.mkdir()
    (inv / "hosts.yml").write_text("nodes:\n  hosts:\n    a:\n      ansible_connection: local\n")
    return ["-i", str(inv)], "group ddplab_nodes (all): missing in the inventory"


def _typos_in_files(lab):
    """Typos in group_vars and host_vars of a copy of the local inventory (not -e)."""
    inv = lab["tmp"] / "inv"
    shutil.copytree(REPO / "inventory" / "local", inv)
    (inv / "group_vars" / "all" / "typo.yml").write_text("---\nddplab_trainer_stpes: 3\n")
    (inv / "host_vars").mkdir()
    (inv / "host_vars" / "local1.yml").write_text("---\nddplab_thread: 2\n")
    return ["-i", str(inv)], "ddplab_thread (local1): ddplab_thread is not a ddplab setting;"


def _missing_entry(lab):
    return ["-e", f"ddplab_code_dir={lab['code']}", "-e", "ddplab_entrypoint=missing.py"], \
        f"ddplab_entrypoint (all): \"missing.py\": {lab['code']}/missing.py does not exist"


def _sync_dest_escapes(lab):
    entry = json.dumps({"src": str(lab["data"]), "dest": "../../etc"})
    return ["-e", json.dumps({"ddplab_sync_dirs": [json.loads(entry)]})], \
        f'ddplab_sync_dirs (all): {entry}: dest "../../etc" is not a folder of its own on the node'


E = "ddplab: error: "


def e(name, value):
    return ["-e", f"{name}={value}"]


ROWS = {
    # the twelve rows of issue 19 (each message without its "ddplab: error: " prefix)
    "data_dir_missing": (e("ddplab_data_dir", "/nonexistent"),
                         "ddplab_data_dir (all): /nonexistent does not exist"),
    "code_dir_missing": (e("ddplab_code_dir", "/nonexistent") + e("ddplab_entrypoint", "train.py"),
                         "ddplab_code_dir (all): /nonexistent does not exist"),
    "wait_maybe": (e("ddplab_wait", "maybe"), 'ddplab_wait (all): "maybe" (a string); true or false'),
    "depth_abc": (e("ddplab_trainer_depth", "abc"),
                  'ddplab_trainer_depth (all): "abc" (a string); an integer'),
    "steps_negative": (e("ddplab_trainer_steps", -5), "ddplab_trainer_steps (all): -5; an integer >= 1"),
    "entrypoint_missing": (_missing_entry, None),
    "manifest_not_json": (_not_json, None),
    "nproc_zero": (e("ddplab_nproc_per_node", 0), "ddplab_nproc_per_node (all): 0; an integer in 1..1024"),
    "port_too_large": (e("ddplab_master_port", 99999),
                       "ddplab_master_port (all): 99999; an integer in 1..65535"),
    "torch_pin_unknown": (e("ddplab_torch_version", "2.99.0"),
                          "ddplab_torch_version (all): 2.99.0 is not offered"),
    "args_string": (e("ddplab_entrypoint_args", "--depth=4"),
                    'ddplab_entrypoint_args (all): "--depth=4" (a string); a list of strings'),
    "typo": (e("ddplab_trainer_stpes", 3), "ddplab_trainer_stpes (all): ddplab_trainer_stpes is not a ddplab "
             "setting; the settings documented in inventory/example/group_vars/all/; did you mean "
             "ddplab_trainer_steps?"),
    # neighbours
    "port_zero": (e("ddplab_master_port", 0), "ddplab_master_port (all): 0;"),
    "steps_zero": (e("ddplab_trainer_steps", 0), "ddplab_trainer_steps (all): 0;"),
    "steps_empty": (e("ddplab_trainer_steps", ""), 'ddplab_trainer_steps (all): "" (an empty string)'),
    "depth_too_large": (e("ddplab_trainer_depth", 65), "ddplab_trainer_depth (all): 65: the trainer says"),
    "nproc_negative": (e("ddplab_nproc_per_node", -1), "ddplab_nproc_per_node (all): -1;"),
    "args_dict": (["-e", '{"ddplab_trainer_extra_args": {"--lr": 1}}'],
                  'ddplab_trainer_extra_args (all): {"--lr": 1} (a mapping); a list of strings'),
    "extra_args_unknown_flag": (["-e", '{"ddplab_trainer_extra_args": ["--bogus"]}'],
                                'ddplab_trainer_extra_args (all): ["--bogus"]: the trainer says'),
    "env_list": (["-e", '{"ddplab_env": ["A=1"]}'], 'ddplab_env (all): ["A=1"]; a mapping'),
    "collect_globs_string": (e("ddplab_collect_globs", "*.json"),
                             'ddplab_collect_globs (all): "*.json" (a string)'),
    "wait_two": (e("ddplab_wait", 2), 'ddplab_wait (all): "2" (a string)'),
    "data_dir_empty": (e("ddplab_data_dir", ""),
                       'ddplab_data_dir (all): "" (an empty string) with the built-in'),
    "run_id_bad": (["-e", '{"ddplab_run_id": "bad id"}'], 'ddplab_run_id (all): "bad id" (a string)'),
    "manifest_dotdot": (_unsafe_manifest, None),
    "shard_changed": (_changed_shard, None),
    "missing_group": (_missing_group, None),
    "limit_leaves_out_a_node": (["--limit", "local1"], "ddplab: error: --limit leaves out local0"),
    "typos_in_group_and_host_vars": (_typos_in_files, None),
    # ddplab_sync_dirs
    "sync_src_missing": (["-e", '{"ddplab_sync_dirs": [{"src": "/nonexistent", "dest": "data/owt"}]}'],
                         'ddplab_sync_dirs (all): {"src": "/nonexistent", "dest": "data/owt"}: '
                         "src /nonexistent does not exist on the control host"),
    "sync_dest_escapes": (_sync_dest_escapes, None),
    "sync_dirs_string": (e("ddplab_sync_dirs", "/data"),
                         'ddplab_sync_dirs (all): "/data" (a string); a list of {src: control-host folder'),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_bad_input_stops_before_any_node_is_touched(lab, row):
    args, message = ROWS[row]
    if callable(args):
        args, message = args(lab)
    if row == "torch_pin_unknown" and external.pip_versions("", "")[0] is None:
        pytest.skip("the package index cannot be reached from here: the pin check is then a warning")
    before = snapshot(REAL_LABS)
    proc, seconds = play(lab, *args)
    out = proc.stdout + proc.stderr
    TIMES[row] = seconds
    median = statistics.median(TIMES.values())
    print(f"\n{row}: {seconds:.2f} s; median so far {median:.2f} s over {len(TIMES)}")
    assert proc.returncode != 0, out[-3000:]
    assert E + message.removeprefix(E) in out, out[-3000:]
    if row == "typos_in_group_and_host_vars":
        assert E + "ddplab_trainer_stpes (all): " in out
    assert "Traceback" not in out
    assert "PLAY [Prepare" not in out and "PLAY [Check whether" not in out
    assert "PLAY [Check every node" not in out
    assert not (lab["home"] / "ddplab").exists(), "a lab folder was created"
    assert not lab["runs"].exists(), "a run folder was created"
    assert snapshot(REAL_LABS) == before


def test_healthy_inventory_passes_validation_with_no_warning(lab):
    proc, seconds = play(lab, playbook="plan.yml")
    out = proc.stdout + proc.stderr
    print(f"\nhealthy validation: {seconds:.2f} s")
    assert proc.returncode == 0, out[-3000:]
    assert "ddplab: warning" not in out and "ddplab: error" not in out and "[WARNING]" not in out, out
    assert not (lab["home"] / "ddplab").exists()


def test_not_strict_turns_a_typo_into_a_warning(lab):
    proc, _ = play(lab, *e("ddplab_strict", "false"), *e("ddplab_trainer_stpes", 3),
                   playbook="plan.yml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "ddplab: warning: ddplab_trainer_stpes (all)" in out
    assert "did you mean ddplab_trainer_steps?" in out
