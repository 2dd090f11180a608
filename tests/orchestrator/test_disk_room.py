"""ddplab/disk_room.py: a transfer is refused before any byte travels when the node's file system under the
folder lacks the room, with one message naming the node, the folder, need and free (here: a local node whose
folder is on a small tmpfs; the simulated hosts' own test is in tests/byo/test_sync_dirs_simlan.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddplab import disk_room
from ddplab.errors import DdplabError
from ddplab.node_command import nodeprobe_command


def spec(tmp_path, base, sizes):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    for name, size in sizes.items():
        (src / name).write_bytes(b"x" * size)
    return {"name": "node1", "base": str(base), "files": list(sizes), "src_dir": str(src),
            "conn": {"local": True}}


def test_room_counts_the_nearest_existing_folder_and_the_bytes_a_transfer_replaces(tmp_path):
    base = tmp_path / "lab" / "not" / "yet"
    (tmp_path / "lab").mkdir()
    out = disk_room.check(spec(tmp_path, base, {"a.bin": 1000}))
    assert out["path"] == str(tmp_path / "lab") and out["need"] == 1000
    base.mkdir(parents=True)
    (base / "a.bin").write_bytes(b"y" * 600)  # rewritten in place of its old 600 bytes
    # the node's command as roles/code_sync passes it (the ddplab_node_argv lookup): nodeprobe disk-room
    room, _ = nodeprobe_command("disk-room", [], sys.executable)
    assert disk_room.check({**spec(tmp_path, base, {"a.bin": 1000}), "room": room})["need"] == 400


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_folder_on_a_small_file_system_is_refused_with_need_and_free(tmp_path):
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(small)], check=True, timeout=30)
    try:
        with pytest.raises(DdplabError) as e:
            disk_room.check(spec(tmp_path, small / "data", {"a.bin": 3 << 20}))
        msg = str(e.value)
        assert msg.startswith(f"node1: {small}/data needs 3.0 MiB ({3 << 20} bytes, 1 files) and its file "
                              f"system ({small}) has 1.0 MiB free"), msg
        assert "nothing was copied" in msg and os.listdir(small) == []
    finally:
        subprocess.run(["umount", str(small)], check=True, timeout=30)
