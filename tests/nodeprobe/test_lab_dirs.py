"""nodeprobe/lab_dirs.py on real folders: the lab folder 0700 when ddplab makes it, set back to 0700 when
ddplab made it before (the older 0755), a folder the user made keeps its mode; a second run changes
nothing."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from nodeprobe import lab_dirs, prereqs

PROGRAM = Path(lab_dirs.__file__)
OLD_MARKER = "This folder is a ddplab lab folder (ddplab_root); ddplab writes and prunes files in it.\n"


def run(root: Path) -> dict:
    """As roles/ddplab/tasks/dirs.yml runs it: the program on stdin of `python -I -`."""
    subs = [a for s in ("code", "data", "runs") for a in ("--sub", str(root / s))]
    out = subprocess.run([sys.executable, "-I", "-", "--root", str(root), *subs], input=PROGRAM.read_text(),
                         capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_lab_folder_is_0700_and_a_second_run_changes_nothing(tmp_path):
    root = tmp_path / "home" / "ddplab"
    old = os.umask(0o022)
    try:
        made = run(root)
    finally:
        os.umask(old)
    assert made["made"] == [str(root), *(str(root / s) for s in ("code", "data", "runs"))]
    assert mode(root) == 0o700 and mode(root / "code") == 0o755
    assert (root / prereqs.ROOT_MARKER).read_text().endswith(lab_dirs.MADE)
    assert run(root) == {"made": [], "tightened": [], "kept": []}


def test_a_lab_folder_ddplab_made_open_is_tightened(tmp_path):
    """A lab made by the older ddplab: 0755, with the marker it wrote then."""
    root = tmp_path / "ddplab"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    (root / prereqs.ROOT_MARKER).write_text(OLD_MARKER)
    got = run(root)
    assert got["tightened"] == [f"{root} 0755 -> 0700"] and mode(root) == 0o700


def test_a_folder_the_user_made_keeps_its_mode(tmp_path):
    """ddplab_root named to an existing empty folder of the user's: adopted (marked), never chmod-ed, now or
    at the next prepare."""
    root = tmp_path / "shared-lab"
    root.mkdir()
    os.chmod(root, 0o750)
    for _ in range(2):
        got = run(root)
        assert got["tightened"] == [] and got["kept"] == [f"{root} 0750 (you made it)"]
        assert mode(root) == 0o750
    assert lab_dirs.ADOPTED in (root / prereqs.ROOT_MARKER).read_text()


def test_the_marker_has_one_name():
    assert lab_dirs.MARKER == prereqs.ROOT_MARKER
