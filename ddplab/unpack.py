"""Unpack an archive that a node sent (roles/logs; nodeprobe/pack_run.py packs it there), member by member.

A node is trusted with its own files, not with the control host's: its archive may hold plain relative
files and folders only. Every member is checked (``check``) before anything is written: a link (sym or
hard), a device, a fifo, an absolute path, an empty, ``.`` or ``..`` part, a name that comes twice or sits
under a file, more than MAX_MEMBERS members or MAX_BYTES (or the free space) in all refuse the whole
archive, with one line naming the member. Then each folder is opened from the destination down with
O_NOFOLLOW (``openat``), and each file is created there under a temporary name with
O_CREAT|O_EXCL|O_NOFOLLOW and renamed over what an earlier collect left: a rename replaces a link in the
way, it never writes through one.

tarfile's ``data`` filter is not used: Python 3.11.7 predates the 2025 fixes of its bypasses (a chain of
links longer than PATH_MAX that os.path.realpath stops resolving, CVE-2025-4517), with which a node wrote
outside its folder on the control host (tests/orchestrator/test_unpack.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile

from ddplab.errors import DdplabError

# One node's logs, metrics and the files of ddplab_collect_globs: far below these; a bigger archive is
# refused before it fills the control host's disk.
MAX_BYTES = 16 << 30
MAX_MEMBERS = 100_000
FILE_TYPES = (tarfile.REGTYPE, tarfile.AREGTYPE)
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TMP_PREFIX = ".ddplab-unpack-"


def kind(member: tarfile.TarInfo) -> str:
    names = {tarfile.SYMTYPE: "a symbolic link", tarfile.LNKTYPE: "a hard link", tarfile.CHRTYPE: "a device",
             tarfile.BLKTYPE: "a device", tarfile.FIFOTYPE: "a fifo", tarfile.GNUTYPE_SPARSE: "a sparse file"}
    return names.get(member.type, f"of type {member.type!r}")


def refusal(member: tarfile.TarInfo) -> str | None:
    """Why this member alone may not be unpacked, or None."""
    if member.type not in FILE_TYPES and member.type != tarfile.DIRTYPE:
        return f"is {kind(member)} (only plain files and folders are unpacked)"
    name = member.name
    if name.startswith("/"):
        return "is an absolute path"
    if "\0" in name or any(part in ("", ".", "..") for part in name.split("/")):
        return "has an empty, '.' or '..' part"
    if member.size < 0 or member.size > MAX_BYTES:
        return f"claims {member.size} bytes"
    return None


def check(members: list[tarfile.TarInfo]) -> int:
    """The bytes of the members' files; DdplabError naming the first member that may not be unpacked."""
    if len(members) > MAX_MEMBERS:
        raise DdplabError(f"it holds more than {MAX_MEMBERS} members")
    files, dirs, total = set(), set(), 0
    for m in members:
        why = refusal(m)
        parts = m.name.split("/")
        if why is None:
            if m.name in files or (m.isfile() and m.name in dirs):
                why = "comes twice (or as a file and a folder)"
            elif any("/".join(parts[:i]) in files for i in range(1, len(parts))):
                why = "is under a member that is a file"
        if why is not None:
            raise DdplabError(f"the member {m.name!r} {why}")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts) + (0 if m.isfile() else 1)))
        if m.isfile():
            files.add(m.name)
            total += m.size
    if total > MAX_BYTES:
        raise DdplabError(f"its files hold {total} bytes, more than {MAX_BYTES}")
    return total


def open_dir(parent_fd: int, name: str) -> int:
    """The folder ``name`` in parent_fd (made when missing), opened without following a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    return os.open(name, DIR_FLAGS, dir_fd=parent_fd)


def write_file(parent_fd: int, name: str, member: tarfile.TarInfo, data) -> None:
    """``name`` in parent_fd: a new file with the member's bytes, renamed over what was there."""
    tmp = f"{TMP_PREFIX}{os.getpid()}-{name}"[:255]
    fd = os.open(tmp, FILE_FLAGS, 0o600, dir_fd=parent_fd)
    try:
        with os.fdopen(fd, "wb", closefd=False) as out:
            shutil.copyfileobj(data, out)
            if out.tell() != member.size:
                raise tarfile.ReadError(f"the member {member.name!r} ends after {out.tell()} of "
                                        f"{member.size} bytes")
        os.fchmod(fd, (member.mode & 0o755) | 0o600)  # no setuid bits, no group or other write (as `data`)
        os.utime(fd, (member.mtime, member.mtime))
        os.replace(tmp, name, src_dir_fd=parent_fd, dst_dir_fd=parent_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=parent_fd)
        raise
    finally:
        os.close(fd)


def unpack(archive, dest) -> list[str]:
    """Unpack ``archive`` (a node's tar.gz) into the existing folder ``dest``; the member names written.
    DdplabError (nothing written) when a member is refused; OSError or tarfile.TarError when it is broken."""
    with tarfile.open(archive, "r:*") as tar:
        members = []
        for m in tar:  # headers only, stopping once there are too many
            members.append(m)
            if len(members) > MAX_MEMBERS:
                break
        total = check(members)
        root = os.open(dest, DIR_FLAGS)
        free = os.statvfs(root)
        if total > free.f_bavail * free.f_frsize:
            os.close(root)
            raise DdplabError(f"its files hold {total} bytes, more than the {free.f_bavail * free.f_frsize} "
                              f"free in {dest}")
        try:
            for m in members:
                *folders, leaf = m.name.split("/")
                fds = [root]
                try:
                    for part in folders + ([leaf] if m.isdir() else []):
                        fds.append(open_dir(fds[-1], part))
                    if m.isfile():
                        write_file(fds[-1], leaf, m, tar.extractfile(m))
                finally:
                    for fd in fds[1:]:
                        os.close(fd)
        finally:
            os.close(root)
    return [m.name for m in members]
