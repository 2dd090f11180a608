"""A file that resolves outside the folder ddplab syncs is refused, by name, before anything is sent.

A hostile repository: a tracked ``vocab.txt -> ../../.ssh/id_ed25519`` leads to a (fake) key of the control
host outside the checkout. The code plan (ddplab/code_tree.py), validate (ddplab/settings/inputs.py) and
sync-push itself (ddplab/sync_push.py, rsync --copy-links) refuse it; a link that stays inside is sent.
"""

import json
import subprocess
import sys

import pytest

from ddplab import code_tree
from ddplab.errors import DdplabError
from ddplab.settings import inputs
from tests.helpers.playbooks import REPO


def git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, timeout=60)


@pytest.fixture
def hostile(tmp_path):
    """(checkout, fake key): a git repository whose tracked vocab.txt links to the key two folders up."""
    key = tmp_path / "home" / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text("FAKE CONTROL HOST KEY\n")
    repo = tmp_path / "home" / "src" / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "train.py").write_text("print('hi')\n")
    (repo / "data" / "real.bin").write_bytes(b"data")
    (repo / "data" / "alias.bin").symlink_to("real.bin")  # stays inside: sent as the file it names
    (repo / "vocab.txt").symlink_to("../../.ssh/id_ed25519")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x")
    return repo, key


def code_tree_cli(trees):
    return subprocess.run([sys.executable, "-m", "ddplab", "code-tree", json.dumps(trees)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_the_code_plan_refuses_a_tracked_link_to_the_control_hosts_key(hostile):
    repo, key = hostile
    proc = code_tree_cli([{"src": str(repo), "dest": "user", "mode": "gitignore"}])
    assert proc.returncode == 2 and proc.stdout == "" and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (
        f"ddplab: error: ddplab_code_dir: {repo}/vocab.txt is a link to {key}, outside {repo}; only files "
        "inside the folder are sent (a link that stays inside is sent as the file it names); replace the "
        "link with a copy of the file, or remove it (git rm) or ignore it; nothing was sent")


def test_a_link_that_stays_inside_is_planned_as_before(hostile):
    repo, _ = hostile
    (repo / "vocab.txt").unlink()
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "safe")
    plan = code_tree.plan([{"src": str(repo), "dest": "user", "mode": "gitignore"}])
    assert [f["dest"] for f in plan["files"]] == ["user/data/alias.bin", "user/data/real.bin",
                                                  "user/train.py"]
    assert plan["lines"][0].split()[0] == plan["lines"][1].split()[0]  # the alias hashes as its file


def test_a_sync_dir_and_an_include_glob_with_a_link_out_are_refused(hostile, tmp_path):
    repo, key = hostile
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "ok.bin").write_bytes(b"1")
    (data / "sub" / "k.bin").symlink_to(key)
    with pytest.raises(DdplabError, match=rf"^ddplab_sync_dirs: {data}/sub/k.bin is a link to {key}, "):
        code_tree.plan([{"src": str(data), "dest": "", "mode": "all"}])
    # a git-ignored link reached by ddplab_code_include is refused too (it was left out silently before)
    (repo / ".gitignore").write_text("vocab.txt\n*.bin\n")
    git(repo, "rm", "-q", "--cached", "vocab.txt", "data/alias.bin", "data/real.bin")
    with pytest.raises(DdplabError, match=rf"{repo}/vocab.txt is a link to {key}"):
        code_tree.plan([{"src": str(repo), "dest": "user", "mode": "gitignore", "include": ["*.txt"]}])


def test_validate_names_the_links_out_before_any_node_changes(hostile, tmp_path):
    repo, key = hostile
    data = tmp_path / "data"
    data.mkdir()
    (data / "tok.json").symlink_to(key)
    v = {"ddplab_code_dir": str(repo), "ddplab_entrypoint": "train.py", "ddplab_pip_requirements": "",
         "ddplab_code_include": [], "ddplab_sync_dirs": [{"src": str(data), "dest": "data/tok"}]}
    [code] = inputs.code(v)
    [sync] = inputs.sync_dirs(v)
    assert code.line().startswith(f"ddplab: error: ddplab_code_dir (all): {repo}/vocab.txt is a link to "
                                  f"{key}")
    assert sync.line().startswith(f"ddplab: error: ddplab_sync_dirs (all): {data}/tok.json is a link to "
                                  f"{key}")


def test_sync_push_refuses_a_file_that_resolves_outside_its_folder(hostile, tmp_path):
    """sync-push itself (the wheels, shards, code and sync dirs all leave through it) sends nothing."""
    repo, key = hostile
    node = tmp_path / "node"
    node.mkdir()
    spec = {"base": str(node), "conn": {"local": True},
            "files": [{"src": str(repo / "train.py"), "dest": "user/train.py"},
                      {"src": str(repo / "vocab.txt"), "dest": "user/vocab.txt"}]}
    argv = [sys.executable, "-m", "ddplab", "sync-push", "--progress", str(tmp_path / "p.json")]
    proc = subprocess.run(argv, input=json.dumps(spec), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert list(node.iterdir()) == []  # the old code copied the key to node/user/vocab.txt
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"ddplab: error: sync: {repo}/vocab.txt is a link to {key}, outside {repo}")
