"""nodeprobe.hashing: one tree-hash format (what sha256sum prints), one exclude list, the manifest digest
and its verify, also when the file is shipped and run alone (roles/code_sync)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys

import pytest

from nodeprobe import hashing
from tests.helpers.probes import REPO


def _tree(root):
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "sub" / ".pytest_cache").mkdir(parents=True)
    files = {"a.py": "x = 1\n", "pkg/b.py": "y = 2\n", "pkg/Z.txt": "upper sorts first\n",
             "sub/.ddplab-code-hash": "nested: real content\n", "space name.txt": "s\n"}
    for rel, text in files.items():
        (root / rel).write_text(text)
    for junk in ("pkg/__pycache__/b.cpython-311.pyc", ".git/HEAD", "sub/.pytest_cache/v", "a.pyc",
                 ".ddplab-code-hash", ".ddplab-code.json"):
        (root / junk).write_text("excluded\n")
    return sorted(files)


def test_sha256_file_is_hashlibs(tmp_path):
    f = tmp_path / "f.bin"
    f.write_bytes(bytes(range(256)) * 5000)
    assert hashing.sha256_file(f) == hashlib.sha256(f.read_bytes()).hexdigest()


def test_tree_lines_are_what_sha256sum_prints_minus_the_exclude_list(tmp_path):
    kept = _tree(tmp_path)
    assert hashing.tree_files(tmp_path) == kept
    sums = subprocess.run(["sha256sum", "--", *kept], cwd=tmp_path, capture_output=True, text=True,
                          check=True).stdout.splitlines()
    assert hashing.tree_lines(tmp_path) == sums
    info = hashing.tree_hash(tmp_path)
    assert info["files"] == len(kept)
    assert info["sha256"] == hashlib.sha256("".join(s + "\n" for s in sums).encode()).hexdigest()
    (tmp_path / "pkg" / "__pycache__" / "new.pyc").write_text("more junk\n")
    assert hashing.tree_hash(tmp_path)["sha256"] == info["sha256"]
    (tmp_path / "a.py").write_text("x = 2\n")
    assert hashing.tree_hash(tmp_path)["sha256"] != info["sha256"]


def test_tree_hash_of_a_missing_folder_is_an_error_not_an_exception(tmp_path):
    assert "is not a directory" in hashing.tree_hash(tmp_path / "nope")["error"]


def test_shipped_alone_it_prints_the_same_lines(tmp_path):
    """roles/code_sync runs the file alone on a node (no package, another cwd)."""
    _tree(tmp_path / "code")
    alone = tmp_path / "shipped" / "hashing.py"
    alone.parent.mkdir()
    shutil.copy(REPO / "nodeprobe" / "hashing.py", alone)
    run = subprocess.run([sys.executable, str(alone), "tree-lines", str(tmp_path / "code")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout == ""  # on a node only what a record says ddplab placed counts: no record, nothing
    (tmp_path / "code" / hashing.SYNC_RECORD).write_text(json.dumps(hashing.tree_files(tmp_path / "code")))
    run = subprocess.run([sys.executable, str(alone), "tree-lines", str(tmp_path / "code")], cwd=tmp_path,
                         capture_output=True, text=True, timeout=30, check=True)
    assert run.stdout.splitlines() == hashing.tree_lines(tmp_path / "code")
    missing = subprocess.run([sys.executable, str(alone), "tree-lines", str(tmp_path / "none")],
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode == 0 and missing.stdout == ""
    usage = subprocess.run([sys.executable, str(alone)], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 2 and "usage:" in usage.stderr


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("hashing") / "shards"
    subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(out), "--docs", "64",
                    "--rows-per-group", "16", "--groups-per-shard", "2"], check=True, cwd=REPO, timeout=120,
                   capture_output=True)
    return out


def test_manifest_digest_is_the_trainers(shards):
    from trainer.data.shards import manifest_digest

    manifest = json.loads((shards / "manifest.json").read_text())
    assert hashing.manifest_digest(manifest["files"]) == manifest["digest"]
    assert manifest_digest(manifest["files"]) == manifest["digest"]
    assert hashing.set_digest(hashing.manifest_files(manifest)) == manifest["digest"]


def test_verify_shards_names_missing_changed_and_extra(shards, tmp_path):
    manifest = json.loads((shards / "manifest.json").read_text())
    assert hashing.verify_shards(shards, manifest)["ok"] is True
    copy = tmp_path / "node"
    shutil.copytree(shards, copy)
    names = sorted(e["file"] for e in manifest["files"])
    (copy / names[0]).unlink()
    (copy / names[1]).write_bytes(b"not a shard")
    (copy / "stray.parquet").write_bytes(b"x")
    r = hashing.verify_shards(copy, manifest)
    assert r["ok"] is False and r["missing"] == [names[0]] and r["changed"] == [names[1]]
    assert r["extra"] == ["stray.parquet"] and r["bad"] == [names[0], names[1]]
    empty = hashing.verify_shards(tmp_path / "no-such-folder", manifest)
    assert empty["bad"] == names and empty["extra"] == []
    # the node's manifest copy: same content (prepare leaves it), changed or missing (prepare rewrites it)
    assert r["manifest_same"] is True and empty["manifest_same"] is False
    (copy / "manifest.json").write_text(json.dumps({**manifest, "digest": "0" * 64}))
    assert hashing.verify_shards(copy, manifest)["manifest_same"] is False


def test_verify_shards_verb_reads_the_manifest_on_stdin(shards):
    manifest = (shards / "manifest.json").read_text()
    r = subprocess.run([sys.executable, "-m", "nodeprobe", "verify-shards", "--dir", str(shards)],
                       input=manifest, capture_output=True, text=True, timeout=30, cwd=REPO)
    assert r.returncode == 0 and json.loads(r.stdout)["ok"] is True
    bad = subprocess.run([sys.executable, "-m", "nodeprobe", "verify-shards", "--dir", str(shards)],
                         input=json.dumps({"files": [{"file": "../etc/passwd", "sha256": "0"}]}),
                         capture_output=True, text=True, timeout=30, cwd=REPO)
    assert bad.returncode == 2 and "not a plain file name" in bad.stderr and "Traceback" not in bad.stderr
