"""nodeprobe/prune_placed.py: the prune of a synced folder reads its record as JSON and removes only plain
files inside the folder, whatever the record says (a newline in a name, '..', an absolute path, a symlinked
folder, a folder)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from nodeprobe import hashing
from nodeprobe.prune_placed import prune_placed

REPO = Path(__file__).resolve().parents[2]


def synced(tmp_path: Path, record: list[str], files: list[str]) -> tuple[Path, Path]:
    """A lab folder with a victim file, and a ddplab_sync_dirs folder in it with these files and record."""
    lab = tmp_path / "lab"
    folder = lab / "sync"
    folder.mkdir(parents=True)
    (lab / "victim.txt").write_text("the lab's own\n")
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(rel)
    (folder / hashing.SYNC_RECORD).write_text(json.dumps(record))
    return lab, folder


def test_a_name_with_a_newline_is_one_name(tmp_path):
    evil = "notes\n.."
    lab, folder = synced(tmp_path, [evil, "keep.txt"], [evil, "keep.txt"])
    out = prune_placed({"dir": str(folder), "keep": ["keep.txt"]})
    assert out["removed"] == [evil] and out["refused"] == []
    assert sorted(os.listdir(folder)) == [hashing.SYNC_RECORD, "keep.txt"]
    assert (lab / "victim.txt").read_text() == "the lab's own\n"


def test_names_that_leave_the_folder_are_refused_and_nothing_outside_goes(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "x.txt").write_text("not ours\n")
    record = ["../victim.txt", str(tmp_path / "lab" / "victim.txt"), "link/x.txt", "a/./b", "sub", "a//b"]
    lab, folder = synced(tmp_path, record, ["sub/inner.txt"])
    (folder / "link").symlink_to(outside)
    out = prune_placed({"dir": str(folder), "keep": []})
    assert out["removed"] == []
    assert {r["path"]: r["why"] for r in out["refused"]} == {
        "../victim.txt": "has an empty, '.' or '..' part",
        str(tmp_path / "lab" / "victim.txt"): "an absolute path",
        "link/x.txt": "its folder link is a symlink or no folder",
        "a/./b": "has an empty, '.' or '..' part",
        "a//b": "has an empty, '.' or '..' part",
        "sub": "a folder (prune removes files only)"}
    assert (outside / "x.txt").exists() and (lab / "victim.txt").exists()
    assert (folder / "sub" / "inner.txt").exists()


def test_a_recorded_symlink_goes_itself_never_its_target(tmp_path):
    lab, folder = synced(tmp_path, ["ln"], [])
    (folder / "ln").symlink_to(lab / "victim.txt")
    assert prune_placed({"dir": str(folder), "keep": []})["removed"] == ["ln"]
    assert not os.path.lexists(folder / "ln") and (lab / "victim.txt").exists()


def test_without_a_record_nothing_goes_and_the_record_follows_the_plan(tmp_path):
    folder = tmp_path / "sync"
    folder.mkdir()
    (folder / "user.txt").write_text("mine\n")
    out = prune_placed({"dir": str(folder), "keep": ["a.txt"], "record": hashing.SYNC_RECORD})
    assert out == {"probe": "prune-placed", "removed": [], "refused": [], "recorded": True}
    assert json.loads((folder / hashing.SYNC_RECORD).read_text()) == ["a.txt"]
    again = prune_placed({"dir": str(folder), "keep": ["a.txt"], "record": hashing.SYNC_RECORD})
    assert again["recorded"] is False and (folder / "user.txt").exists()


def test_shards_go_by_record_not_by_glob(tmp_path):
    """The data folder: a *.parquet ddplab did not place stays; a node prepared before the record existed
    counts the shards of the manifest.json ddplab copied there."""
    data = tmp_path / "data"
    data.mkdir()
    for name in ("old.parquet", "new.parquet", "mine.parquet"):
        (data / name).write_text(name)
    (data / "manifest.json").write_text(json.dumps({"files": [{"file": "old.parquet", "sha256": "0" * 64}]}))
    spec = {"dir": str(data), "keep": ["new.parquet"], "record": hashing.SHARD_RECORD,
            "manifest_placed": True}
    assert prune_placed(spec)["removed"] == ["old.parquet"]
    assert sorted(p.name for p in data.glob("*.parquet")) == ["mine.parquet", "new.parquet"]
    assert json.loads((data / hashing.SHARD_RECORD).read_text()) == ["new.parquet"]
    assert prune_placed({**spec, "keep": []})["removed"] == ["new.parquet"]  # by the record now
    assert (data / "mine.parquet").exists()


def test_the_command_reads_the_spec_on_stdin(tmp_path):
    lab, folder = synced(tmp_path, ["gone.txt"], ["gone.txt"])
    proc = subprocess.run([sys.executable, "-m", "nodeprobe", "prune-placed"], cwd=REPO, text=True,
                          input=json.dumps({"dir": str(folder), "keep": []}), capture_output=True, timeout=60)
    assert proc.returncode == 0 and json.loads(proc.stdout)["removed"] == ["gone.txt"], proc.stderr


def test_tree_json_keeps_a_newline_name_whole(tmp_path):
    name = "a\nb"
    lab, folder = synced(tmp_path, [name], [name])
    proc = subprocess.run([sys.executable, "-I", "-", "tree-json", str(folder)], text=True,
                          input=(REPO / "nodeprobe" / "hashing.py").read_text(), capture_output=True,
                          timeout=60)
    assert json.loads(proc.stdout) == [hashing.sha256_file(folder / name) + "  " + name], proc.stderr
