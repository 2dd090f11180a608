"""Relations between settings and the control host's inputs: folders, entry point, shards' manifest."""

import json
import shutil
from pathlib import Path

import pytest
from settings_helpers import errors, inventory, one_error, shards  # noqa: F401


@pytest.fixture
def data(shards, tmp_path):  # noqa: F811
    d = tmp_path / "shards"
    shutil.copytree(shards, d)
    return d


@pytest.fixture
def code(tmp_path):
    d = tmp_path / "code"
    (d / "pkg").mkdir(parents=True)
    (d / "train.py").write_text("print('hi')\n")
    (d / "requirements.txt").write_text("numpy\n")
    return d


def byo(data, code, **kw):
    return inventory(data, **{"ddplab_code_dir": str(code), "ddplab_entrypoint": "train.py", **kw})


def test_healthy_builtin_and_byo(data, code):
    assert errors(inventory(data)) == []
    inv = byo(data, code, ddplab_entrypoint_args=["--x"], ddplab_pip_requirements="requirements.txt")
    assert errors(inv) == []
    assert errors(byo(data, code, ddplab_entrypoint="-m pkg.main", ddplab_data_dir="")) == []


@pytest.mark.parametrize(("name", "path", "found"), [
    ("ddplab_data_dir", "/nonexistent", "/nonexistent does not exist"),
    ("ddplab_code_dir", "/nonexistent", "/nonexistent does not exist"),
    ("ddplab_repo_dir", "/nonexistent", "/nonexistent does not exist"),
])
def test_missing_folder(data, code, name, path, found):
    inv = byo(data, code, **{name: path})
    line = one_error(inv, name)
    assert f"(all): {found}; a folder on the control host;" in line


def test_folder_that_is_a_file(data, code):
    line = one_error(inventory(data, ddplab_data_dir=str(code / "train.py")), "ddplab_data_dir")
    assert "is a file" in line


def test_code_dir_without_entrypoint_and_back(data, code):
    one_error(inventory(data, ddplab_code_dir=str(code)), "ddplab_entrypoint")
    line = one_error(inventory(data, ddplab_entrypoint="missing.py"), "ddplab_code_dir")
    assert 'while ddplab_entrypoint is "missing.py"' in line


@pytest.mark.parametrize(("entry", "found"), [
    ("missing.py", "does not exist"), ("../outside.py", "is outside ddplab_code_dir"),
    ("/etc/passwd", "is outside ddplab_code_dir"), ("pkg", "does not exist"),
])
def test_entrypoint_script(data, code, entry, found):
    assert found in one_error(byo(data, code, ddplab_entrypoint=entry), "ddplab_entrypoint")


@pytest.mark.parametrize("entry", ["-m", "-m 3bad", "-m pkg..mod", "-m pkg mod"])
def test_entrypoint_module_name(data, code, entry):
    one_error(byo(data, code, ddplab_entrypoint=entry), "ddplab_entrypoint")


def test_requirements_must_be_in_the_code_dir(data, code):
    assert "does not exist" in one_error(byo(data, code, ddplab_pip_requirements="req.txt"),
                                         "ddplab_pip_requirements")
    one_error(inventory(data, ddplab_pip_requirements="requirements.txt"), "ddplab_pip_requirements")


def test_empty_data_dir_needs_own_code(data):
    line = one_error(inventory(data, ddplab_data_dir=""), "ddplab_data_dir")
    assert "built-in trainer" in line


def test_entrypoint_args_with_builtin_trainer(data):
    one_error(inventory(data, ddplab_entrypoint_args=["--x"]), "ddplab_entrypoint_args")


def test_log_pattern_is_checked_before_any_node(data, code):
    good = r"^it (?P<step>\d+) (?P<loss>\S+) (?P<tokens_per_sec>[\d,]+)"
    assert errors(byo(data, code, ddplab_log_pattern=good)) == []
    for pattern, said in ((r"step (?P<step>\d+", "is not a Python regex"),
                          (r"step (?P<step>\d+) lr (?P<lr>\S+)", "has the unknown group name(s) lr"),
                          (r"loss (?P<loss>\S+)", "has no (?P<step>...) group")):
        line = one_error(byo(data, code, ddplab_log_pattern=pattern), "ddplab_log_pattern")
        assert f"{json.dumps(pattern)} {said}" in line and "a step group and others among step, total" in line
        inv = byo(data, code, ddplab_log_pattern=pattern)
        assert errors({**inv, "inputs": False}) == [line]  # status and collect_logs read it too
    line = one_error(inventory(data, ddplab_log_pattern=r"(?P<step>\d+)"), "ddplab_log_pattern")
    assert "with the built-in trainer" in line


def test_env_names(data):
    line = one_error(inventory(data, ddplab_env={"MASTER_PORT": "1", "1BAD": "x", "OK": "y"}), "ddplab_env")
    assert '"1BAD"' in line and '"MASTER_PORT"' in line and '"OK"' not in line


# --- the shards' manifest ------------------------------------------------------------------------------

def _manifest(data):
    return data / "manifest.json"


def _rewrite(data, fn):
    m = json.loads(_manifest(data).read_text())
    fn(m)
    _manifest(data).write_text(json.dumps(m))


def test_manifest_not_json(data):
    _manifest(data).write_text("{files: [")
    line = one_error(inventory(data), str(_manifest(data)))
    assert "(control host): not JSON" in line and "regenerate it with `make data`" in line


def test_manifest_missing(data):
    _manifest(data).unlink()
    assert "missing" in one_error(inventory(data), str(_manifest(data)))


@pytest.mark.parametrize("name", ["../shard_00000.parquet", "sub/shard.parquet", ".."])
def test_manifest_paths_with_slash_or_dotdot(data, name):
    _rewrite(data, lambda m: m["files"][0].update(file=name))
    line = one_error(inventory(data), str(_manifest(data)))
    assert f"manifest entry {name!r} is not a plain file name" in line, line
    assert "regenerate it with `make data`" in line


def test_manifest_without_files(data):
    _rewrite(data, lambda m: m.pop("files"))
    one_error(inventory(data), str(_manifest(data)))


def test_manifest_digest_mismatch(data):
    _rewrite(data, lambda m: m.update(digest="0" * 64))
    assert "digest 0000000000000000... does not match" in one_error(inventory(data), str(_manifest(data)))


def test_shard_changed_or_missing(data):
    first = sorted(data.glob("*.parquet"))[0]
    first.write_bytes(first.read_bytes() + b"x")
    assert f"sha256 of {first.name} differs" in one_error(inventory(data), str(_manifest(data)))
    first.unlink()
    line = one_error(inventory(data), str(_manifest(data)))
    assert f"lists files missing from {data}: {first.name}" in line


def test_no_manifest_check_with_own_data(code, tmp_path):
    inv = byo(tmp_path / "none", code, ddplab_data_dir="")
    assert errors(inv) == []


# --- the trainer's own validation --------------------------------------------------------------------

@pytest.mark.parametrize(("name", "value", "said"), [
    ("ddplab_trainer_depth", 65, "--depth must be in 1..64"),
    ("ddplab_pg_timeout", 2, "--pg-timeout-s must be at least 5 seconds"),
    ("ddplab_trainer_extra_args", ["--bogus"], "trainer argument --bogus: unknown flag"),
    ("ddplab_trainer_extra_args", ["--batch-size", "0"], "--batch-size must be at least 1"),
    ("ddplab_trainer_extra_args", ["--comm", "zip"], "invalid choice"),
    ("ddplab_trainer_extra_args", ["--balance-every", "0"], "--balance-every must be at least 1"),
])
def test_trainer_checks_its_flags(data, name, value, said):
    line = one_error(inventory(data, **{name: value}), name)
    assert "the trainer says" in line and said in line


def test_trainer_flags_ignored_for_own_code(data, code):
    assert errors(byo(data, code, ddplab_trainer_depth=65)) == []


def test_trainer_argv_matches_launch_args():
    from ddplab.settings.external import trainer_argv
    from ddplab.settings.validate import resolve

    given = {"ddplab_trainer_extra_args": ["--lr", "0.01"], "ddplab_resume": True, "ddplab_balance": True}
    values, _ = resolve(given, "/r/playbooks")
    assert trainer_argv(values) == ["--data", "/r/data/shards", "--out", "run/out", "--run-id", "run-check",
                                    "--steps", "50", "--depth", "2", "--pg-timeout-s", "45", "--resume",
                                    "--balance", "--lr", "0.01", "--threads", "1"]


# Ansible's templar runs in a child process: importing ansible patches sys.intern, which breaks a later
# torch._dynamo import in this pytest process.
RENDER_LAUNCH_ARGS = """
import json, sys
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import lookup_loader
from ansible.template import Templar, trust_as_template
lookup_loader.add_directory(sys.argv[3])  # plugins/lookup: ddplab_launch_command
loader = DataLoader()
launch_vars = loader.load_from_file(sys.argv[1], trusted_as_template=True)
templar = Templar(loader=loader, variables={**launch_vars, **json.loads(sys.argv[2])})
print(json.dumps(list(templar.template(trust_as_template("{{ launch_args }}")))))
"""


@pytest.mark.parametrize("balance", [True, False])
def test_launch_args_rendered_by_ansible_are_the_argv_the_check_validates(balance):
    """roles/launch/vars/main.yml's launch_args, rendered by Ansible's own templar, against trainer_argv:
    the same flags in the same order (node paths and the run id are placeholders in the check)."""
    import json
    import subprocess
    import sys

    from ddplab.settings.external import trainer_argv
    from ddplab.settings.validate import resolve

    given = {"ddplab_trainer_extra_args": ["--lr", "0.01"], "ddplab_balance": balance}
    values, _ = resolve(given, "/r/playbooks")
    repo = Path(__file__).resolve().parents[2]
    node = {"ddplab_byo": False, "ddplab_lab": {"data": "/r/data/shards", "pythonpath": "/r/code"},
            "ddplab_run_dir": "run", "ddplab_run": "run-check", **values}
    proc = subprocess.run([sys.executable, "-c", RENDER_LAUNCH_ARGS, str(repo / "roles/launch/vars/main.yml"),
                           json.dumps(node), str(repo / "plugins" / "lookup")],
                          capture_output=True, text=True, timeout=60, check=True)
    rendered = json.loads(proc.stdout)
    assert [*rendered, "--threads", "1"] == trainer_argv(values)
    assert ("--balance" in rendered) is balance


def test_watching_playbooks_do_not_need_the_inputs(data, tmp_path):
    """status/stop/collect_logs/wait validate with inputs false: no shards or code folder needed here."""
    gone = tmp_path / "no-shards"
    inv = inventory(data, ddplab_data_dir=str(gone))
    assert "does not exist" in one_error(inv, "ddplab_data_dir")
    assert errors({**inv, "inputs": False}) == []
    assert errors({**inv, "inputs": "false"}) == []
    # the settings themselves are still checked
    bad = inventory(data, ddplab_data_dir=str(gone), ddplab_master_port=99999)
    assert "ddplab_master_port" in " ".join(errors({**bad, "inputs": False}))


def sync(data, tmp_path, *entries):
    return inventory(data, ddplab_sync_dirs=[{"src": str(s), "dest": d} for s, d in entries])


def test_sync_dirs_healthy(data, tmp_path):
    assert errors(sync(data, tmp_path, (tmp_path, "data/owt"), (data, "/srv/shards"), (data, "extra"))) == []


@pytest.mark.parametrize(("src", "dest", "found"), [
    ("/nonexistent", "data/owt", "src /nonexistent does not exist on the control host"),
    ("FILE", "data/owt", "is a file on the control host"),
    ("DIR", "../outside", 'dest "../outside" is not a folder of its own'),
    ("DIR", "data/../../x", 'dest "data/../../x" is not a folder of its own'),
    ("DIR", "/srv/../x", 'dest "/srv/../x" is not a folder of its own'),
    ("DIR", "~/x", 'dest "~/x" is not a folder of its own'),
    ("DIR", "/", 'dest "/" is not a folder of its own'),
    ("DIR", ".", 'dest "." is not a folder of its own'),
    ("DIR", "code/data", 'dest "code/data" is not a folder of its own'),
    ("DIR", "runs", 'dest "runs" is not a folder of its own'),
    ("DIR", "data", 'dest "data" is not a folder of its own'),
])
def test_sync_dirs_bad_entry(data, tmp_path, src, dest, found):
    src = {"FILE": str(data / "manifest.json"), "DIR": str(tmp_path)}.get(src, src)
    line = one_error(sync(data, tmp_path, (src, dest)), "ddplab_sync_dirs")
    assert line.startswith("ddplab: error: ddplab_sync_dirs (all): ") and found in line


def test_sync_dirs_overlapping_dests(data, tmp_path):
    line = one_error(sync(data, tmp_path, (tmp_path, "data/a"), (data, "data/a/b")), "ddplab_sync_dirs")
    assert 'dest "data/a/b" overlaps another entry' in line
    assert errors(sync(data, tmp_path, (tmp_path, "data/a"), (data, "data/ab"))) == []


@pytest.mark.parametrize("value", ["data", ["data"], [{"src": "/tmp"}], [{"src": "/tmp", "dest": ""}],
                                   [{"src": "/tmp", "dest": "x", "mode": "all"}]])
def test_sync_dirs_shape(data, value):
    line = one_error(inventory(data, ddplab_sync_dirs=value), "ddplab_sync_dirs")
    assert "a list of {src: control-host folder, dest: node folder}" in line
