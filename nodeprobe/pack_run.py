"""Pack one run's files on this node into a tar.gz for collect_logs.yml (one fetch per node, not per file).

    python -m nodeprobe.pack_run RUN_DIR OUT.tgz --socket SOCK --session RUN_ID \
        [--pattern launch.log ...] [--exclude '*.pt' ...] [--glob 'ckpt/*.json' ...] [--glob-dir DIR]

Takes the files of RUN_DIR whose name matches a --pattern (recursively, minus --exclude), plus the files
named by each --glob (relative to --glob-dir, the ranks' working folder, default RUN_DIR; `**` recurses;
only files inside that folder; packed under their path relative to it), and the whole
tmux scrollback of the run's session as pane.txt. Prints one JSON object: {"files": [...], "pane": bool}.
A run folder that does not exist or holds no matching file prints {"files": []} (the role names it).
Standard library only: it runs with the node's system Python from the synced code folder.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import io
import json
import os
import subprocess
import sys
import tarfile
import time


def select(run_dir: str, patterns: list[str], excludes: list[str], globs: list[str],
           glob_dir: str | None = None) -> dict[str, str]:
    """{name in the archive: path on the node} of the files to collect."""
    glob_dir = glob_dir or run_dir
    root = os.path.realpath(glob_dir)
    out: dict[str, str] = {}
    for dirpath, _dirs, files in os.walk(run_dir):
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in patterns) and not any(fnmatch.fnmatch(name, x)
                                                                           for x in excludes):
                path = os.path.join(dirpath, name)
                out[os.path.relpath(path, run_dir)] = path
    for pattern in globs:
        for path in glob.glob(os.path.join(glob.escape(glob_dir), pattern), recursive=True):
            real = os.path.realpath(path)
            if os.path.isfile(real) and real.startswith(root + os.sep):
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


def pack(out: str, files: dict[str, str], pane: str) -> None:
    tmp = f"{out}.tmp"
    with tarfile.open(tmp, "w:gz") as tar:
        for rel, path in files.items():
            tar.add(path, arcname=rel, recursive=False)
        data = pane.encode()
        info = tarfile.TarInfo("pane.txt")
        info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
        tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nodeprobe.pack_run", description=__doc__.split("\n\n")[0])
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
    json.dump({"files": list(files), "archive": a.out if files else None}, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
