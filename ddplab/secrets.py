"""python -m ddplab secrets: the lab's folder of control-side secrets (ddplab_secrets_dir), made 0700.

Keys ddplab makes on the control host (the munge key of a Slurm lab) live there, not under runs/: people
zip runs/ to share results and `make clean` deletes it. The folder is made with every missing parent 0700
(~/.config/ddplab/<lab tag> by default); an existing folder that others may read or that another user owns
is refused, naming it and the fix.

``--adopt OLD NAME``: a key an older ddplab made at OLD (runs/.slurm/munge.key) is moved to DIR/NAME, so a
running cluster keeps its key instead of getting a new one. Only a plain file of the control user's is
moved (a symlink or another user's file is left, and said), and only when DIR/NAME does not exist yet;
OLD's folder is removed when the move leaves it empty. Prints JSON: {dir, made, moved: [..], left: [..]}.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
from pathlib import Path

from ddplab.errors import DdplabError

MODE = 0o700


def make_dir(folder: Path) -> bool:
    """Make `folder` and its missing parents 0700; True when it was made. Refuses an existing one that is
    not the user's own or that others may enter."""
    if folder.is_dir():
        st = folder.stat()
        if st.st_uid != os.getuid():
            raise DdplabError(f"{folder} (ddplab_secrets_dir) belongs to uid {st.st_uid}, not to you "
                              f"(uid {os.getuid()}); set ddplab_secrets_dir to a folder of your own")
        if st.st_mode & 0o077:
            raise DdplabError(f"{folder} (ddplab_secrets_dir) is mode {stat.S_IMODE(st.st_mode):04o}: others "
                              f"may read the lab's keys; run `chmod 700 {folder}` (or choose another folder)")
        return False
    missing = []
    for parent in [folder, *folder.parents]:
        if parent.exists():
            break
        missing.append(parent)
    for path in reversed(missing):
        path.mkdir(mode=MODE)
        path.chmod(MODE)  # whatever the umask
    return True


def adopt(old: Path, new: Path) -> str:
    """Move the key an older ddplab left at `old` to `new`: "moved", "left: <why>" or "" (nothing there)."""
    try:
        st = old.lstat()
    except FileNotFoundError:
        return ""
    if new.exists():
        return f"left: {old} stays where it is ({new} is the lab's key)"
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return f"left: {old} is not a plain file of yours; {new} is made anew"
    try:
        os.rename(old, new)
    except OSError:  # another file system: copy (0600, never over a file), then remove the old one
        fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as dst, open(old, "rb") as src:
            shutil.copyfileobj(src, dst)
            dst.flush()
            os.fsync(dst.fileno())
        old.unlink()
    new.chmod(0o600)
    with contextlib.suppress(OSError):  # ddplab made it for this key alone; a folder with other files stays
        old.parent.rmdir()
    return "moved"


def secrets(folder: Path, adoptions: list[tuple[Path, str]]) -> dict:
    made = make_dir(folder)
    out = {"dir": str(folder), "made": made, "moved": [], "left": []}
    for old, name in adoptions:
        said = adopt(old, folder / name)
        if said == "moved":
            out["moved"].append(f"{old} -> {folder / name}")
        elif said:
            out["left"].append(said.removeprefix("left: "))
    return out


def add_parser(sub):
    p = sub.add_parser("secrets", help="make the lab's folder of control-side secrets (0700), move old "
                       "keys in")
    p.add_argument("--dir", required=True, type=Path, help="the folder (ddplab_secrets_dir)")
    p.add_argument("--adopt", nargs=2, action="append", default=[], metavar=("OLD", "NAME"),
                   help="move a key an older ddplab left at OLD to DIR/NAME (repeatable)")
    p.set_defaults(func=cmd_secrets)


def cmd_secrets(args):
    if not args.dir.is_absolute():
        raise DdplabError(f"ddplab_secrets_dir {args.dir} is not an absolute path; give one such as "
                          "/home/me/.config/ddplab/mylab")
    print(json.dumps(secrets(args.dir, [(Path(o), n) for o, n in args.adopt])))
