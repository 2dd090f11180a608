"""python -m ddplab sync-push on this host (a local "node": rsync without ssh) and its pure parts: which
folder each file is sent from, the ssh command built from Ansible's settings, rsync's progress lines."""

import json
import os
import subprocess
import sys

import pytest

from ddplab import sync_push, transfer_progress
from ddplab.errors import DdplabError
from tests.helpers.playbooks import REPO


def test_files_are_grouped_by_the_folder_they_are_sent_from():
    files = [{"src": "/home/me/repo/data/a.bin", "dest": "user/data/a.bin"},
             {"src": "/home/me/repo/train.py", "dest": "user/train.py"},
             {"src": "/x/trainer/model.py", "dest": "trainer/model.py"},
             {"src": "/data/owt/sub/b.bin", "dest": "sub/b.bin"}]
    assert sync_push.groups(files) == {("/home/me/repo", "user"): ["data/a.bin", "train.py"],
                                       ("/x", ""): ["trainer/model.py"], ("/data/owt", ""): ["sub/b.bin"]}
    with pytest.raises(DdplabError, match="same file name"):
        sync_push.groups([{"src": "/a/x.bin", "dest": "y.bin"}])


def test_ssh_command_keeps_ansibles_order_and_host_key_settings():
    conn = {"host": "fe80::1", "user": "me", "port": 2222, "key": "~/.ssh/id",
            "ssh_args": "-o StrictHostKeyChecking=accept-new -o ControlMaster=auto",
            "common_args": "-o UserKnownHostsFile='/tmp/known hosts'", "extra_args": ""}
    argv = sync_push.ssh_command(conn)
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"]
    assert argv.index("StrictHostKeyChecking=accept-new") < argv.index("UserKnownHostsFile=/tmp/known hosts")
    assert argv[-4:] == ["-p", "2222", "-i", os.path.expanduser("~/.ssh/id")]
    assert sync_push.target(conn, "/lab/data/") == "me@[fe80::1]:/lab/data/"
    rsync = sync_push.rsync_argv(conn, "/src", "/lab/data", "/tmp/list")
    assert "--ignore-times" in rsync and rsync[-2:] == ["/src/", "me@[fe80::1]:/lab/data/"]
    assert "--rsh" not in sync_push.rsync_argv({"local": True}, "/src", "/dst", "/tmp/list")


def test_progress_lines():
    assert transfer_progress.rsync_bytes("    536,870,912  50%  102.40MB/s    0:00:05 (xfr#4, to-chk=4/8)") \
        == 536870912
    assert transfer_progress.rsync_bytes("sending incremental file list") is None
    m = transfer_progress.Meter(total=1 << 30, files=8)
    m.add(0.0, 0)
    m.add(2.0, 256 << 20)
    assert m.rate == 128 << 20 and m.eta == pytest.approx(6.0)
    assert m.state(2.0)["line"] == "256.0 MiB / 1.0 GiB (25%) of 8 files, 128.0 MiB/s, ETA 0:06, 2 s so far"
    done = transfer_progress.line("done", 1 << 30, 1 << 30, 1, None, None, 8.0, ["user/data/part3.bin"])
    assert done == "sent 1.0 GiB in 8.0 s (128.0 MiB/s), 1 file: user/data/part3.bin"


def test_sync_push_sends_the_listed_files_and_writes_its_progress(tmp_path):
    src, node = tmp_path / "repo", tmp_path / "node"
    (src / "data").mkdir(parents=True)
    node.mkdir()
    (src / "data" / "a.bin").write_bytes(os.urandom(3 << 20))
    (src / "data" / "left.bin").write_bytes(b"not listed")
    (node / "mine.txt").write_text("the user's\n")
    spec = {"base": str(node), "conn": {"local": True},
            "files": [{"src": str(src / "data" / "a.bin"), "dest": "user/data/a.bin"}]}
    progress = tmp_path / "progress.json"
    proc = subprocess.run([sys.executable, "-m", "ddplab", "sync-push", "--progress", str(progress)],
                          input=json.dumps(spec), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert (node / "user" / "data" / "a.bin").read_bytes() == (src / "data" / "a.bin").read_bytes()
    assert not (node / "user" / "data" / "left.bin").exists() and (node / "mine.txt").exists()
    state = json.loads(progress.read_text())
    assert state["state"] == "done" and state["done"] == state["total"] == 3 << 20
    assert state["line"].endswith("1 file: user/data/a.bin")


def test_sync_push_names_the_node_when_rsync_fails(tmp_path):
    spec = {"base": str(tmp_path / "no" / "such" / "lab"), "conn": {"local": True},
            "files": [{"src": __file__, "dest": "x/test_sync_push.py"}]}
    argv = [sys.executable, "-m", "ddplab", "sync-push", "--progress", str(tmp_path / "p.json")]
    proc = subprocess.run(argv, input=json.dumps(spec), capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"ddplab: error: sync to {tmp_path}/no/such/lab/x failed: rsync")
    assert json.loads((tmp_path / "p.json").read_text())["state"] == "failed"
