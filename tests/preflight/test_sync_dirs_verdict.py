"""Preflight's sync_dirs check: a node's real fingerprint of a ddplab_sync_dirs folder (only the files ddplab
placed, from the folder's record) judged against the control host's src, by the verdict on a dump folder."""

from __future__ import annotations

import json
import shutil

from nodeprobe import hashing
from tests.helpers.probes import probe
from tests.nodeprobe.test_verdict import cluster, failing, real, run_verdict  # noqa: F401


def node_copy(tmp_path):
    src, node = tmp_path / "src", tmp_path / "node"
    (src / "tok").mkdir(parents=True)
    (src / "train.bin").write_bytes(b"\x00" * 4096)
    (src / "tok" / "vocab.json").write_text('{"a": 0}\n')
    shutil.copytree(src, node)
    (node / hashing.SYNC_RECORD).write_text(json.dumps(["tok/vocab.json", "train.bin"]))
    (node / "made-by-the-user.txt").write_text("not placed by ddplab: not counted\n")
    return src, node


def judged(real, tmp_path, node, src, dest="data/owt"):  # noqa: F811
    files = cluster(real, 2)
    fp = probe("fingerprint", "--threads", "1", "--sync-dir", f"{dest}={node}")
    for h in ("node0", "node1"):
        files[f"{h}/fingerprint.json"]["sync_dirs"] = fp["sync_dirs"]
    return run_verdict(tmp_path, files, "--sync-dir", json.dumps({"src": str(src), "dest": dest}))


def test_a_copy_with_a_users_file_matches_its_src(real, tmp_path):  # noqa: F811
    src, node = node_copy(tmp_path)
    rc, res, _ = judged(real, tmp_path, node, src)
    assert rc == 0, res["failures"]
    assert res["hosts"]["node1"]["sync_dirs"]["detail"].startswith("data/owt 2 files ")


def test_a_changed_file_fails_with_one_line_naming_the_folder(real, tmp_path):  # noqa: F811
    src, node = node_copy(tmp_path)
    (node / "train.bin").write_bytes(b"\x01" * 4096)
    rc, res, _ = judged(real, tmp_path, node, src)
    assert rc == 1 and failing(res) == {("node0", "sync_dirs"), ("node1", "sync_dirs")}
    cell = res["hosts"]["node1"]["sync_dirs"]
    assert cell["detail"].startswith(f"data/owt/ differs from {src} on the control host (2 vs 2 files, ")
    assert cell["fix"] == ("re-run playbooks/prepare.yml (--tags sync: these folders alone) to sync data/owt "
                           "to node1")


def test_a_missing_folder_and_no_sync_dirs(real, tmp_path):  # noqa: F811
    src, _ = node_copy(tmp_path)
    rc, res, _ = judged(real, tmp_path, tmp_path / "nowhere", src)
    assert rc == 1 and "data/owt: not on the node" in res["hosts"]["node0"]["sync_dirs"]["detail"]
    rc, res, _ = run_verdict(tmp_path / "none", cluster(real, 2))
    assert rc == 0 and res["hosts"]["node0"]["sync_dirs"]["status"] == "n/a"
