"""The node-side code hash and the sync's prune cover only the files ddplab placed (the code folder's
.ddplab-code-files.json): what the user's code writes into its synced folder (checkpoints, out/) is
neither hashed nor removed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ddplab import code_tree
from nodeprobe import hashing

REPO = Path(__file__).resolve().parents[2]


def node_code(tmp_path):
    """A node's code folder as roles/code_sync leaves it, plus outputs the user's code wrote."""
    code = tmp_path / "code"
    for rel in ("trainer/a.py", "user/train.py", "user/data/x.bin", "user/out/ckpt.pt", "user/out/log.txt"):
        (code / rel).parent.mkdir(parents=True, exist_ok=True)
        (code / rel).write_text(rel)
    record = {"trainer": ["a.py"], "user": ["data/x.bin", "train.py"]}
    (code / hashing.RECORD).write_text(json.dumps(record))
    return code


def test_the_code_folder_and_one_tree_count_only_placed_files(tmp_path):
    code = node_code(tmp_path)
    assert hashing.tree_files(code) == ["trainer/a.py", "user/data/x.bin", "user/train.py"]
    assert hashing.tree_files(code / "user") == ["data/x.bin", "train.py"]  # the record of its parent
    before = hashing.tree_hash(code / "user")["sha256"]
    (code / "user" / "out" / "more.txt").write_text("another output")
    assert hashing.tree_hash(code / "user")["sha256"] == before
    (code / "user" / "train.py").write_text("changed")
    assert hashing.tree_hash(code / "user")["sha256"] != before
    (code / "user" / "train.py").unlink()  # a placed file gone: the hash must differ, not ignore it
    assert hashing.tree_files(code / "user") == ["data/x.bin"]


def test_without_a_record_every_file_counts_on_the_control_host_and_none_on_a_node(tmp_path):
    code = node_code(tmp_path)
    (code / hashing.RECORD).unlink()
    assert "user/out/ckpt.pt" in hashing.tree_files(code)  # a source folder: every file is synced
    assert hashing.tree_files(code, placed_only=True) == []  # a node's copy: nothing to prune


def test_a_node_counts_no_file_outside_the_recorded_trees(tmp_path):
    """A folder the user keeps beside the synced trees (code/thesis/) is neither hashed nor pruned."""
    code = node_code(tmp_path)
    (code / "thesis").mkdir()
    (code / "thesis" / "chapter1.tex").write_text("my thesis")
    (code / "notes.txt").write_text("notes")
    assert hashing.tree_files(code, placed_only=True) == ["trainer/a.py", "user/data/x.bin", "user/train.py"]


def test_unplaced_names_what_a_sync_would_overwrite(tmp_path):
    code = node_code(tmp_path)
    (code / "thesis").mkdir()
    (code / "thesis" / "chapter1.tex").write_text("my thesis")
    rels = ["trainer/a.py", "user/out/ckpt.pt", "thesis/chapter1.tex", "user/new.py"]
    assert hashing.unplaced(code, rels) == ["user/out/ckpt.pt", "thesis/chapter1.tex"]
    (code / hashing.RECORD).unlink()
    assert hashing.unplaced(code, rels) == ["trainer/a.py", "user/out/ckpt.pt", "thesis/chapter1.tex"]


def test_the_shipped_script_prints_the_placed_lines(tmp_path):
    code = node_code(tmp_path)
    alone = tmp_path / "hashing.py"
    alone.write_text((REPO / "nodeprobe" / "hashing.py").read_text())
    out = subprocess.run([sys.executable, str(alone), "tree-lines", str(code)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.splitlines()
    assert [ln.split("  ", 1)[1] for ln in out] == ["trainer/a.py", "user/data/x.bin", "user/train.py"]
    unplaced = subprocess.run([sys.executable, str(alone), "unplaced", str(code), "trainer/a.py",
                               "user/out/log.txt"], capture_output=True, text=True, timeout=60,
                              check=True).stdout.splitlines()
    assert unplaced == ["user/out/log.txt"]


def test_the_plan_ships_included_files_and_records_what_it_places(tmp_path):
    src = tmp_path / "repo"
    (src / "data").mkdir(parents=True)
    (src / "train.py").write_text("print(1)\n")
    (src / ".gitignore").write_text("*.bin\nout/\n")
    (src / "data" / "x.bin").write_bytes(b"\x00\x01")
    (src / "data" / "y.bin").write_bytes(b"\x02")
    plain = code_tree.plan([{"src": str(src), "dest": "user", "mode": "gitignore"}])
    assert [f["dest"] for f in plain["files"]] == ["user/.gitignore", "user/train.py"]
    plan = code_tree.plan([{"src": str(src), "dest": "user", "mode": "gitignore", "include": ["data/x.bin"]}])
    assert [f["dest"] for f in plan["files"]] == ["user/.gitignore", "user/data/x.bin", "user/train.py"]
    assert plan["placed"] == {"user": [".gitignore", "data/x.bin", "train.py"]}
    assert plan["trees"][0]["included"] == 1 and plan["hash"] != plain["hash"]
