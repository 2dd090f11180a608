"""``nodeprobe relay-take < SPEC`` (shipped alone, run by ddplab/relay.py over the control host's own SSH
connection to this node, after a peer relayed a batch): move the staged files whose sha256 is the control
host's into place; delete everything else in the staging folder.

A peer's relay key writes only into ``<lab folder>/.relay/incoming/`` (nodeprobe/relay_receive.py), so
nothing a peer sends is used before this step proved it is the file the control host planned:

- each planned file is first taken out of the staging folder (a rename into ``.relay/``, where a peer cannot
  write, so it cannot be swapped while it is hashed), then read with O_NOFOLLOW, and must be one regular file
  (one link) whose sha256 is the plan's; then it is renamed over ``<lab folder>/<dest>`` (never written
  through a link at dest: a link there is replaced), mode 0644, or 0755 when it arrived executable. A file
  that does not match is deleted and named (the control host then sends it itself);
- the dests come from the control host's plan, which already refused to overwrite a file ddplab did not
  place (roles/code_sync refuse_unplaced.yml, as for the star path); they must be relative, without ``..``,
  and outside ``.relay``;
- everything in the staging folder that is not a file still to come (``keep``: the plan's later batches)
  is deleted: the folder is ddplab's.

SPEC (JSON on stdin; shipped, it follows the program on stdin: ddplab/node_command.py ``BOOT``):
``{"root": lab folder, "files": [{"dest": path relative to root, "sha256": hex}], "keep": [dests]}``.
Prints ``{"placed": [dests], "refused": [{"dest", "why"}]}``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import sys

RELAY_DIR = ".relay"
STAGING = f"{RELAY_DIR}/incoming"
HOLD = f"{RELAY_DIR}/taking"
CHUNK = 1 << 20


def safe_rel(dest: str) -> str:
    """``dest`` as a clean relative path, or ValueError (absolute, ``..``, empty, or inside .relay)."""
    rel = os.path.normpath(str(dest))
    if rel.startswith("/") or rel in (".", "") or rel.split("/")[0] in ("..", RELAY_DIR) or "\0" in rel:
        raise ValueError(f"not a path inside the lab folder: {dest!r}")
    return rel


def no_links_under(base: str, rel: str) -> bool:
    """True when every folder of ``rel`` under ``base`` is a real folder (a peer makes no links; be sure)."""
    path = base
    for part in rel.split("/")[:-1]:
        path = os.path.join(path, part)
        try:
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                return False
        except OSError:
            return False
    return True


def sha256_fd(fd: int) -> str:
    """The sha256 of the file held open (not nodeprobe.hashing.sha256_file, which opens a path: the name could
    be swapped between the check and the hash; and a module shipped alone imports no other of ddplab's)."""
    h = hashlib.sha256()
    while chunk := os.read(fd, CHUNK):
        h.update(chunk)
    return h.hexdigest()


def move_into_place(held: str, fd: int, dest: str) -> None:
    """Rename ``held`` over ``dest`` (its folders made as needed); across file systems, a copy renamed."""
    os.makedirs(os.path.dirname(dest), mode=0o755, exist_ok=True)
    try:
        os.replace(held, dest)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    tmp = f"{os.path.dirname(dest)}/.{os.path.basename(dest)}.ddplab-relay"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    out = os.open(tmp, flags, stat.S_IMODE(os.fstat(fd).st_mode))
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, CHUNK):
            os.write(out, chunk)
    finally:
        os.close(out)
    os.replace(tmp, dest)
    os.unlink(held)


def discard(path: str) -> None:
    """Remove ``path`` whatever it is (a file, a folder, a link), without following links."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def take_one(root: str, rel: str, want: str) -> str:
    """Move one staged file into place; "" when placed, else why not."""
    staged, held = f"{root}/{STAGING}/{rel}", f"{root}/{HOLD}"
    if not no_links_under(f"{root}/{STAGING}", rel):
        return "its staging path holds something other than folders"
    discard(held)
    try:
        os.rename(staged, held)
    except FileNotFoundError:
        return "it did not arrive"
    try:
        fd = os.open(held, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        discard(held)
        return f"it is not a regular file ({e.strerror})"
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            discard(held)
            return "it is not a regular file with one link"
        got = sha256_fd(fd)
        if got != want:
            discard(held)
            return f"its sha256 is {got}, the control host's is {want}"
        os.fchmod(fd, 0o755 if st.st_mode & stat.S_IXUSR else 0o644)
        move_into_place(held, fd, f"{root}/{rel}")
        return ""
    finally:
        os.close(fd)


def sweep(root: str, keep: set[str]) -> None:
    """Delete everything in the staging folder but the files in ``keep`` (and the folders holding them)."""
    staging = f"{root}/{STAGING}"
    for folder, dirs, files in os.walk(staging, topdown=False):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            if os.path.relpath(path, staging) not in keep:
                os.unlink(path)
        for name in dirs:
            path = os.path.join(folder, name)
            if not os.path.islink(path) and not os.listdir(path):
                os.rmdir(path)


def take(spec: dict) -> dict:
    root = os.path.normpath(str(spec["root"]))
    placed, refused = [], []
    for f in spec.get("files") or []:
        try:
            rel = safe_rel(f["dest"])
        except ValueError as e:
            refused.append({"dest": str(f.get("dest")), "why": str(e)})
            continue
        why = take_one(root, rel, str(f["sha256"]))
        (refused.append({"dest": rel, "why": why}) if why else placed.append(rel))
    keep = {os.path.normpath(str(dest)) for dest in spec.get("keep") or []}
    sweep(root, keep)
    return {"placed": placed, "refused": refused}


if __name__ == "__main__":
    print(json.dumps(take(json.loads(sys.stdin.read()))))
