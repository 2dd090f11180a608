"""``python -m nodeprobe prune-placed < spec``: remove from one node folder the files ddplab placed there (its
record, read as JSON) that the control host's plan no longer has, then record what the folder holds now.

The spec is ``{"dir": DIR, "keep": [relative paths of the plan], "prune": true, "record": NAME | null,
"manifest_placed": false}``: the files of DIR's record (hashing.placed: the code folder's, a ddplab_sync_dirs
folder's or the data folder's; no record, no file, unless ``manifest_placed``: then the shards of the data
folder's manifest.json, which only ddplab writes) that are not in ``keep`` are removed; with ``record``,
DIR/NAME is then written with ``keep`` (only when it differs). Prints ``{"removed": [...], "refused":
[{"path", "why"}], "recorded": bool}``.

A record is data, not a list of safe paths: a name with a newline is one name; a name that is absolute, has
an empty, ``.`` or ``..`` part, reaches its file through a symlinked folder, or is a folder itself is
refused (listed, never followed). Each removal walks from DIR one folder at a time with O_NOFOLLOW and
unlinks by name in the last one, so nothing outside DIR can be reached, whatever the record says.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

from nodeprobe import hashing
from nodeprobe.place_files import place
from nodeprobe.spec import SpecError, read_spec


class Refused(Exception):
    """A recorded path that prune never follows; the message says why."""


def unsafe(rel: str) -> str:
    """Why ``rel`` is no plain relative path inside its folder ("" when it is one)."""
    if not isinstance(rel, str) or not rel:
        return "not a relative path"
    if rel.startswith("/"):
        return "an absolute path"
    if "\0" in rel:
        return "holds a NUL byte"
    if any(part in ("", ".", "..") for part in rel.split("/")):
        return "has an empty, '.' or '..' part"
    return ""


def remove(root_fd: int, rel: str) -> bool:
    """Unlink ``rel`` below the folder open as ``root_fd``, its parents opened one by one without following
    a symlink; True when a file was removed, False when it was gone already. Raises Refused."""
    why = unsafe(rel)
    if why:
        raise Refused(why)
    *parents, name = rel.split("/")
    fd = os.dup(root_fd)
    try:
        for part in parents:
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return False
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"its folder {part} is a symlink or no folder") from None
                raise
            os.close(fd)
            fd = nxt
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(st.st_mode):
            raise Refused("a folder (prune removes files only)")
        os.unlink(name, dir_fd=fd)  # a symlink itself goes, never what it points to
        return True
    finally:
        os.close(fd)


def recorded(root: str, manifest_placed: bool = False) -> set[str]:
    """The paths DIR's record says ddplab placed. ``manifest_placed`` (the data folder): without its record,
    the shards of the manifest.json ddplab copied there (a node prepared before the record existed)."""
    trees = hashing.placed(root)
    if trees or not manifest_placed:
        return {rel for files in trees.values() for rel in files}
    try:
        with open(os.path.join(root, "manifest.json")) as f:
            return set(hashing.manifest_files(json.load(f)))
    except (OSError, ValueError):
        return set()


def prune_placed(spec: dict) -> dict:
    root, keep = spec["dir"], spec.get("keep")
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        raise SpecError("the spec needs keep: [relative paths]")
    removed, refused = [], []
    if spec.get("prune", True) and os.path.isdir(root):
        root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for rel in sorted(recorded(root, bool(spec.get("manifest_placed"))) - set(keep)):
                try:
                    if remove(root_fd, rel):
                        removed.append(rel)
                except Refused as e:
                    refused.append({"path": rel, "why": str(e)})
        finally:
            os.close(root_fd)
    written = False
    if spec.get("record"):
        name = spec["record"]
        if name not in (hashing.SYNC_RECORD, hashing.SHARD_RECORD):
            raise SpecError(f"record {name!r} is not one of ddplab's list records")
        written = place(Path(root) / name, json.dumps(sorted(keep)) + "\n", 0o644)
    return {"probe": "prune-placed", "removed": removed, "refused": refused, "recorded": written}


def run(text: str) -> dict:
    return prune_placed(read_spec(text, needs=("dir",)))
