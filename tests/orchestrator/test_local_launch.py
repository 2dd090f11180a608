"""The embedded local inventory: 2 ranks on this machine, no SSH, no root (what `make demo` runs).

A launch on it, waited for and then observed (status, stop, status), is tests/test_readme.py's: the
README's own `make demo`."""

import hashlib
import socket
import subprocess

import pytest

from tests.helpers.playbooks import make_shards, playbook, tail

pytestmark = pytest.mark.slow


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _digests(root) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_prepare_refuses_a_folder_it_did_not_make_and_keeps_files_it_did_not_place(tmp_path_factory):
    """Issue 27's first finding, on the local inventory: ddplab_root pointing at the user's folders."""
    home = tmp_path_factory.mktemp("home-own")
    shards = make_shards(tmp_path_factory.getbasetemp() / "shards")
    env = {"HOME": str(home)}
    work = home / "work"  # the user's own folder, with a code/ of theirs
    for rel, text in (("code/thesis/chapter1.tex", "chapter one"), ("code/user/notes.txt", "notes")):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_text(text)
    before = _digests(home)
    for root, said in ((str(work), f"ddplab_root {work} ({work}) holds files and ddplab did not make it"),
                       ("~", "ddplab_root (all): \"~\"")):
        refused = playbook("prepare.yml", extra={"ddplab_data_dir": shards, "ddplab_root": root}, env=env,
                           timeout=300)
        out = refused.stdout + refused.stderr
        assert refused.returncode != 0 and said in out and "Traceback" not in out, tail(refused)
        assert _digests(home) == before, "a refused prepare changed files"

    # lab folders ddplab made (its marker) but with no record of placed files yet, the user's files in
    # them, and an editor open on a lab file: prepare syncs its code and leaves all of that alone
    mine = {}
    for lab in ("local0", "local1"):
        root = home / "ddplab" / lab
        (root / "code" / "thesis").mkdir(parents=True)
        (root / ".ddplab-lab").write_text("")
        mine[root / "code" / "thesis" / "chapter1.tex"] = f"chapter one on {lab}"
        mine[root / "code" / "trainer" / "notes.md"] = "the user's notes beside the synced trainer"
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    model = home / "ddplab" / "local0" / "code" / "trainer" / "model.py"
    editor = subprocess.Popen(["bash", "-c", f"exec -a vim tail -F {model}"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        extra = {"ddplab_data_dir": shards, "ddplab_master_port": free_port()}
        prepared = playbook("prepare.yml", extra=extra, env=env, timeout=420)
        assert prepared.returncode == 0, tail(prepared)
        assert model.exists()  # the synced code arrived
        assert {p: p.read_text() for p in mine} == mine  # and nothing of the user's was pruned
        assert editor.poll() is None, "prepare signalled an editor open on a lab file"
    finally:
        editor.kill()
        editor.wait(timeout=10)
