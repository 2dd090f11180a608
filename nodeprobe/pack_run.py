"""Pack one run's files on this node into a tar.gz for collect_logs.yml (one fetch per node, not per file).

    python -m nodeprobe pack-run RUN_DIR OUT.tgz --socket SOCK --session RUN_ID \
        [--pattern launch.log ...] [--exclude '*.pt' ...] [--glob 'ckpt/*.json' ...] [--glob-dir DIR]

Takes the files of RUN_DIR whose name matches a --pattern (recursively, minus --exclude), plus the files
named by each --glob (relative to --glob-dir, the ranks' working folder, default RUN_DIR; `**` recurses;
only files inside that folder; packed under their path relative to it), and the whole tmux scrollback of the
run's session as pane.txt. Every member is a plain file (a link is packed as the file it names, when that is
inside its folder): the control host unpacks plain files only (ddplab/unpack.py). The archive is 0600 and
trainer.env goes in with the values of ddplab_env redacted. Prints one JSON object: {"files": [...],
"archive": OUT, "sha256": the archive's SHA-256} (the control host checks its copy against it,
plugins/action/ddplab_fetch.py). A run folder that does not exist or holds no matching file prints
{"files": [], "archive": null, "sha256": null} (the role names it).
Standard library only: it runs with the node's system Python from the synced code folder.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import time

from nodeprobe.hashing import sha256_file


def plain_inside(path: str, folder: str) -> bool:
    """path is (or links to) a regular file inside folder."""
    real = os.path.realpath(path)
    return os.path.isfile(real) and real.startswith(os.path.realpath(folder) + os.sep)


def select(run_dir: str, patterns: list[str], excludes: list[str], globs: list[str],
           glob_dir: str | None = None) -> dict[str, str]:
    """{name in the archive: path on the node} of the files to collect."""
    glob_dir = glob_dir or run_dir
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(run_dir):
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in patterns) and not any(fnmatch.fnmatch(name, x)
                                                                           for x in excludes):
                path = os.path.join(dirpath, name)
                if plain_inside(path, run_dir):
                    out[os.path.relpath(path, run_dir)] = path
    for pattern in globs:
        for path in glob.glob(os.path.join(glob.escape(glob_dir), pattern), recursive=True):
            if plain_inside(path, glob_dir):
                out.setdefault(os.path.relpath(path, glob_dir), path)
    return dict(sorted(out.items()))


def capture_pane(socket: str, session: str) -> str:
    """The run's whole tmux scrollback, or a line saying why there is none."""
    try:
        p = subprocess.run(["tmux", "-S", socket, "capture-pane", "-p", "-J", "-S", "-", "-E", "-",
                            "-t", f"={session}:"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"(no tmux pane: {e})\n"
    return p.stdout if p.returncode == 0 else f"(no tmux pane: {p.stderr.strip()})\n"


# trainer.env (roles/launch/templates/trainer.env.j2): everything after this comment is ddplab_env, whose
# values may be secrets. The archive carries them as REDACTED; the node's own copy stays 0600.
SECRETS_FROM = "# ddplab_env"
REDACTED = "<redacted>"
ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
UNREADABLE = "# (ddplab_env could not be read as shell words: every line of it is left out)"


def redact_env(text: str) -> str:
    """trainer.env with the value of every ddplab_env variable replaced, by key (keys kept: they say what
    was set). The part after SECRETS_FROM is read as the shell reads it (shell words: a quoted value may span
    lines and hold quotes, ``=`` or ``#``), and written back as one ``KEY=<redacted>`` line per variable."""
    lines = text.splitlines(keepends=True)
    at = next((i for i, line in enumerate(lines) if line.startswith(SECRETS_FROM)), len(lines))
    head, marker, rest = "".join(lines[:at]), "".join(lines[at:at + 1]), "".join(lines[at + 1:])
    if not marker:
        return text
    words = shlex.shlex(rest, posix=True)
    words.whitespace_split = True
    try:
        keys = [m.group(0) for word in words if (m := ENV_KEY.match(word))]
    except ValueError:  # an unclosed quote: no word boundary can be trusted
        return head + marker + UNREADABLE + "\n"
    return head + marker + "".join(f"{key}{REDACTED}\n" for key in keys)


def _add_text(tar: tarfile.TarFile, name: str, text: str, mode: int) -> None:
    data = text.encode()
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), mode
    tar.addfile(info, io.BytesIO(data))


def pack(out: str, files: dict[str, str], pane: str) -> None:
    """The archive, 0600 from its first byte (it is removed once fetched, roles/logs)."""
    tmp = f"{out}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a leftover temp file of an interrupted pack keeps its mode otherwise
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        for rel, path in files.items():
            if os.path.basename(rel) == "trainer.env":
                with open(path, errors="replace") as f:
                    _add_text(tar, rel, redact_env(f.read()), 0o600)
            else:
                with open(path, "rb") as f:  # the file a link names, as a plain file
                    tar.addfile(tar.gettarinfo(arcname=rel, fileobj=f), f)
        _add_text(tar, "pane.txt", pane, 0o644)
    os.replace(tmp, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nodeprobe pack-run", description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("out")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--session", required=True)
    ap.add_argument("--pattern", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--glob", action="append", default=[])
    ap.add_argument("--glob-dir", default=None, help="folder the --glob patterns are relative to (RUN_DIR)")
    a = ap.parse_args(argv)
    files = select(a.run_dir, a.pattern, a.exclude, a.glob, a.glob_dir) if os.path.isdir(a.run_dir) else {}
    if files:
        pack(a.out, files, capture_pane(a.socket, a.session))
    json.dump({"files": list(files), "archive": a.out if files else None,
               "sha256": sha256_file(a.out, use_cache=False) if files else None}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
