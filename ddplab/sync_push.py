"""``python -m ddplab sync-push --progress FILE < SPEC``: send files to one node with rsync, with progress.

roles/code_sync runs it on the control host (one ddplab_control task per node) for the files whose hash
differs on the node (the code, its ddplab_code_include data, each ddplab_sync_dirs folder) and shows FILE's
``line`` on every poll: one rsync per source folder, the bytes of all of them counted together.

SPEC (JSON on stdin)::

    {"base": "/root/ddplab/code",                     # node folder the dest paths are relative to
     "files": [{"src": "/home/me/repo/data/a.bin", "dest": "user/data/a.bin"}, ...],
     "src_dir": "/home/me/shards",      # optional: then a file may be a name, the same under src_dir and base
     "conn": {"local": false, "host": "10.0.0.5", "user": "me", "port": 22, "key": "~/.ssh/id",
              "ssh_args": "...", "common_args": "...", "extra_args": "..."}}   # as Ansible's ssh plugin

The ssh options come in Ansible's own order (ansible.cfg ssh_args, then the inventory's
ansible_ssh_common_args and ansible_ssh_extra_args; ssh takes the first value of each option), so host keys
are checked as for every other task (accept-new by default). No become: files arrive as the SSH user.
``--ignore-times``: a listed file is always sent (our hash said it differs, even if its size and mtime
agree); unchanged blocks of it are still not resent (rsync's delta transfer). ``--copy-links`` sends a link as
the file it names, so a file that resolves outside its source folder is refused before anything is sent
(``confine``; the planners, ddplab/code_tree.py, refuse it first and name the setting).

FILE is rewritten (atomically, at most twice a second) as ``{"state": "running" | "done" | "failed",
"done", "total", "files", "rate", "eta", "elapsed", "line"}``. Exit 0, or 2 with one ``ddplab: error:``
line naming the node and rsync's own message.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ddplab import code_tree
from ddplab.errors import DdplabError
from ddplab.transfer_progress import Meter, rsync_bytes

WRITE_EVERY_S = 0.5


def expand(spec: dict) -> list[dict]:
    """spec's files as {src, dest}: a bare name is src_dir/name on the control host, name under base."""
    src_dir = str(spec.get("src_dir") or "").rstrip("/")
    out = []
    for f in spec["files"]:
        if isinstance(f, str):
            if not src_dir:
                raise DdplabError(f"sync: the file {f!r} is a bare name but the spec has no src_dir")
            f = {"src": f"{src_dir}/{f}", "dest": f}
        out.append(f)
    return out


def groups(files: list[dict]) -> dict[tuple[str, str], list[str]]:
    """{(source folder, dest folder relative to base): [paths relative to both]}: each file's longest
    common path tail of src and dest is what rsync recreates under the dest folder."""
    out: dict[tuple[str, str], list[str]] = {}
    for f in files:
        src, dest = str(f["src"]).rstrip("/").split("/"), str(f["dest"]).strip("/").split("/")
        n = 0
        while n < min(len(src) - 1, len(dest)) and src[-1 - n] == dest[-1 - n]:
            n += 1
        if n == 0:
            raise DdplabError(f"sync-push: {f['src']} and {f['dest']} do not end in the same file name; "
                              "give each file its own name on both sides")
        key = ("/".join(src[:-n]) or "/", "/".join(dest[:-n]))
        out.setdefault(key, []).append("/".join(src[-n:]))
    return out


def confine(grouped: dict[tuple[str, str], list[str]]) -> None:
    """DdplabError naming the first file whose realpath is outside its source folder (``groups``' key)."""
    for (src_dir, _sub), rels in grouped.items():
        code_tree.refuse_outside("sync", src_dir, rels)


def ssh_command(conn: dict) -> list[str]:
    argv = ["ssh", "-o", "BatchMode=yes"]
    for key in ("ssh_args", "common_args", "extra_args"):
        argv += shlex.split(str(conn.get(key) or ""))
    if conn.get("port"):
        argv += ["-p", str(int(conn["port"]))]
    if conn.get("key"):
        argv += ["-i", os.path.expanduser(str(conn["key"]))]
    return argv


def target(conn: dict, path: str) -> str:
    if conn.get("local"):
        return path
    host = str(conn["host"])
    host = f"[{host}]" if ":" in host else host
    user = f"{conn['user']}@" if conn.get("user") else ""
    return f"{user}{host}:{path}"


def rsync_argv(conn: dict, src_dir: str, dest_dir: str, list_file: str) -> list[str]:
    argv = ["rsync", "--recursive", "--times", "--copy-links", "--ignore-times", "--protect-args",
            "--partial",
            "--from0", f"--files-from={list_file}", "--info=progress2", "--no-inc-recursive"]
    if not conn.get("local"):
        argv += ["--rsh", shlex.join(ssh_command(conn))]
    return argv + [src_dir.rstrip("/") + "/", target(conn, dest_dir.rstrip("/") + "/")]


def write_state(path: str, state: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def stream(argv: list[str], stdin: bytes | None, err, meter: Meter, start: float, offset: int,
           on_state) -> tuple[int, str]:
    """Run one rsync (``--info=progress2``), feeding ``meter`` its byte counts plus ``offset`` and calling
    ``on_state(meter.state(...))`` at most every WRITE_EVERY_S; (exit code, its last stderr words)."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=err, env={**os.environ, "LC_ALL": "C"})
    if stdin is not None:
        proc.stdin.write(stdin)
        proc.stdin.close()
    buf, last_write = b"", 0.0
    while chunk := proc.stdout.read1(4096):
        buf += chunk
        *updates, buf = buf.replace(b"\n", b"\r").split(b"\r")
        counts = [c for u in updates if (c := rsync_bytes(u.decode(errors="replace"))) is not None]
        if counts:
            meter.add(time.monotonic() - start, offset + counts[-1])
        if time.monotonic() - last_write >= WRITE_EVERY_S:
            on_state(meter.state(time.monotonic() - start))
            last_write = time.monotonic()
    rc = proc.wait()
    err.seek(0)
    return rc, (" ".join(err.read().split())[-400:] or f"exit code {rc}") if rc else ""


def push(spec: dict, progress) -> dict:
    """Send spec's files; ``progress`` is the state file's path, or a function given each state."""
    on_state = progress if callable(progress) else (lambda state: write_state(progress, state))
    conn, base = spec["conn"], str(spec["base"]).rstrip("/")
    files = expand(spec)
    if shutil.which("rsync") is None:
        raise DdplabError("rsync is not installed on the control host; install it (apt-get install rsync)")
    grouped = groups(files)
    confine(grouped)
    total = sum(os.path.getsize(f["src"]) for f in files)
    meter, start, offset = Meter(total, len(files), [str(f["dest"]) for f in files]), time.monotonic(), 0
    on_state(meter.state(0.0))
    for (src_dir, sub), rels in grouped.items():
        dest_dir = f"{base}/{sub}" if sub else base
        with tempfile.NamedTemporaryFile("w", suffix=".files") as lst, tempfile.TemporaryFile("w+") as err:
            lst.write("".join(r + "\0" for r in rels))
            lst.flush()
            rc, why = stream(rsync_argv(conn, src_dir, dest_dir, lst.name), None, err, meter, start, offset,
                             on_state)
            if rc != 0:
                on_state({**meter.state(time.monotonic() - start, "failed"), "line": why})
                raise DdplabError(f"sync to {target(conn, dest_dir)} failed: {why}; check that the "
                                  "node is up and has rsync (playbooks/prepare.yml installs it)")
        offset += sum(os.path.getsize(os.path.join(src_dir, r)) for r in rels)
        meter.add(time.monotonic() - start, offset)
    final = meter.state(time.monotonic() - start, "done")
    on_state(final)
    return final


def add_parser(sub):
    p = sub.add_parser("sync-push", help="send files to one node with rsync, writing progress to a file")
    p.add_argument("--progress", required=True, help="JSON file rewritten with the transfer's progress")
    p.set_defaults(func=cmd_sync_push)


def cmd_sync_push(args):
    try:
        spec = json.loads(sys.stdin.read())
        if not isinstance(spec.get("files"), list) or not spec.get("base") or not isinstance(spec.get("conn"),
                                                                                              dict):
            raise ValueError("expected base, files and conn")
    except (ValueError, AttributeError) as e:
        raise DdplabError(f"sync-push: the spec on stdin is not usable ({e}); see python -m ddplab sync-push "
                          "--help") from None
    from ddplab import disk_room  # here: it imports this module

    disk_room.check(spec)  # before any byte travels: room on the node's file system under base
    print(json.dumps(push(spec, args.progress)))
    return 0
