"""The lab folders on a node: ddplab_root (0700: the lab's code, venv, data, runs and secrets are the run
user's alone) and its code, data and runs folders (stdlib only, shipped alone: no code is on the node yet).

    nodeprobe lab-dirs --root ROOT --sub CODE --sub DATA --sub RUNS

Prints ``{"made": [...], "tightened": [...], "kept": [...]}`` (a prepared node: all empty, changed=0).

- A folder it creates gets 0700 (the root) or 0755 (inside the closed root, the mode of the others does not
  let anyone in).
- The root gets the marker ``.ddplab-lab`` (node_prereqs refuses a non-empty ddplab_root without it). A root
  ddplab creates is marked as made by ddplab; an existing empty folder the user named is marked as adopted.
- A root ddplab made (its marker does not say adopted; markers written before this said "made") that is
  open to others is set back to 0700 ("tightened"); an adopted folder keeps the user's mode ("kept"), since
  ddplab never changes the mode of a folder it did not make.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys

MARKER = ".ddplab-lab"  # nodeprobe/prereqs.py ROOT_MARKER (this program runs alone: no import)
ROOT_MODE = 0o700
SUB_MODE = 0o755
TEXT = "This folder is a ddplab lab folder (ddplab_root); ddplab writes and prunes files in it.\n"
ADOPTED = "adopted: you made this folder and ddplab keeps its mode\n"
MADE = "made by ddplab\n"


def _mkdir(path: str, mode: int) -> bool:
    """Make ``path`` (and missing parents, with the umask's mode) at exactly ``mode``; False if it exists."""
    if os.path.isdir(path):
        return False
    parent = os.path.dirname(path)
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    os.mkdir(path, mode)
    os.chmod(path, mode)  # mkdir's mode is masked by the umask
    return True


def _write_marker(root: str, made: bool) -> None:
    fd = os.open(os.path.join(root, MARKER), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(TEXT + (MADE if made else ADOPTED))


def made_by_ddplab(root: str) -> bool:
    """The root's marker says ddplab made the folder (every marker but an adopted one)."""
    try:
        with open(os.path.join(root, MARKER), errors="replace") as f:
            return ADOPTED not in f.read()
    except OSError:
        return False


def lab_dirs(root: str, subs: list[str]) -> dict:
    out: dict[str, list[str]] = {"made": [], "tightened": [], "kept": []}
    root = os.path.expanduser(root)
    existed = os.path.isdir(root)
    if _mkdir(root, ROOT_MODE):
        out["made"].append(root)
    if not os.path.lexists(os.path.join(root, MARKER)):
        _write_marker(root, made=not existed)
    mode = stat.S_IMODE(os.stat(root).st_mode)
    if mode & 0o077:
        if made_by_ddplab(root) and os.stat(root).st_uid == os.getuid():
            os.chmod(root, ROOT_MODE)
            out["tightened"].append(f"{root} {mode:04o} -> {ROOT_MODE:04o}")
        else:
            out["kept"].append(f"{root} {mode:04o} (you made it)")
    for sub in subs:
        if _mkdir(os.path.expanduser(sub), SUB_MODE):
            out["made"].append(sub)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="lab_dirs", description=__doc__.splitlines()[0])
    p.add_argument("--root", required=True)
    p.add_argument("--sub", action="append", default=[])
    a = p.parse_args(argv)
    print(json.dumps(lab_dirs(a.root, a.sub)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
