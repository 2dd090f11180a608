"""Which interpreters on this node have exactly the lab's torch: run before any venv or synced code.

Shipped alone by roles/torch_env (``nodeprobe: torch-candidates``; stdlib only, no package imports):
``torch_candidates.py [--torch-only] [--stamp FILE] [--record FILE] [--platform-of PY] PYTHON...`` prints
one JSON object ``{"candidates": [{"python": <path or the name asked>, "torch": <version without +local, or
null>, "checked": "import" or "stamp"}], "recorded": <the record file's first line, or null>}`` (the
role rewrites the record of the node's Python only when it differs: no second round trip on a prepared
node), and with
``--platform-of``, ``"platform": "<major.minor> <machine> <glibc>"`` of that Python (the wheels a new
venv made with it takes), or null.
A candidate counts only when torch, numpy and pyarrow all import (the trainer needs the three); with
``--torch-only``, when torch imports (a user's code venv: their code needs the pinned torch, and numpy and
pyarrow only when their requirements name them).

Importing torch takes seconds, and a no-change prepare would pay it on every run: with ``--stamp``, a
candidate whose import passed before is taken again without importing when nothing of the packages
checked changed since (the stat of each package folder, its ``__init__.py`` and torch/lib, read
without importing them). A reinstalled, upgraded or damaged package changes one of those and is
imported again. Preflight's fingerprint imports torch on every run regardless.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

# `python -c` puts the working folder first on sys.path, and a probe runs from the login folder: a stray
# numpy.py or platform.py there would stand in for the real package. Run each check from "/" instead.
CHECK_CWD = "/"
PACKAGES = ("numpy", "pyarrow", "torch")  # the built-in trainer's
TORCH_ONLY = ("torch",)
# Run by the candidate itself, the packages to check as its arguments.
IMPORT_CHECK = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(importlib.import_module("torch").__version__.split("+")[0])
"""
# Run by the candidate itself, without importing the packages (find_spec of a top-level package only
# locates it): what must stay the same for an earlier import check to still hold.
STAT_KEY = """
import importlib.util, json, os, sys
key = [sys.version]
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        print("null"); raise SystemExit
    pkg = os.path.dirname(spec.origin)
    for p in (pkg, spec.origin, os.path.join(pkg, "lib")):
        try:
            st = os.stat(p)
            key.append([p, st.st_mtime_ns, st.st_size, st.st_ino])
        except OSError:
            key.append([p, None])
print(json.dumps(key))
"""


def torch_version(python: str, packages: tuple = PACKAGES, timeout: float = 120) -> str | None:
    try:
        out = subprocess.run([python, "-c", IMPORT_CHECK, *packages], capture_output=True, text=True,
                             timeout=timeout, cwd=CHECK_CWD, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


PLATFORM = ("import platform, sys; "
            "print('%d.%d' % sys.version_info[:2], platform.machine(), platform.libc_ver()[1])")


def platform_of(python: str) -> str | None:
    try:
        out = subprocess.run([python, "-c", PLATFORM], capture_output=True, text=True, timeout=30,
                             cwd=CHECK_CWD, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def stat_key(python: str, packages: tuple = PACKAGES) -> list | None:
    try:
        out = subprocess.run([python, "-c", STAT_KEY, *packages], capture_output=True, text=True, timeout=30,
                             cwd=CHECK_CWD, check=False)
        return json.loads(out.stdout) if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def read_stamp(path: str | None) -> dict:
    if not path:
        return {}
    try:
        with open(path) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def write_stamp(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:  # no stamp: the next prepare imports again, nothing else changes
        pass


def candidates(pythons: list[str], stamp: str | None = None, packages: tuple = PACKAGES) -> list[dict]:
    known, fresh = read_stamp(stamp), {}
    out = []
    for name in pythons:
        path = shutil.which(name)
        if not path:
            out.append({"python": name, "torch": None, "checked": None})
            continue
        key = stat_key(path, packages) if stamp else None
        seen = known.get(path) or {}
        if key is not None and seen.get("key") == key and seen.get("torch"):
            version, how = seen["torch"], "stamp"
        else:
            version, how = torch_version(path, packages), "import"
        if version and key is not None:
            fresh[path] = {"key": key, "torch": version}
        out.append({"python": path, "torch": version, "checked": how})
    if stamp and fresh != {p: v for p, v in known.items() if p in fresh}:
        write_stamp(stamp, {**known, **fresh})
    return out


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    files = {"--stamp": None, "--record": None, "--platform-of": None}
    packages = PACKAGES
    while args[:1] == ["--torch-only"] or args[:1] and args[0] in files:
        if args[0] == "--torch-only":
            packages, args = TORCH_ONLY, args[1:]
            continue
        if len(args) < 2:
            print(f"torch_candidates.py: error: {args[0]} needs a file", file=sys.stderr)
            return 2
        files[args[0]], args = args[1], args[2:]
    recorded = None
    if files["--record"]:
        try:
            with open(files["--record"]) as f:
                recorded = f.readline().strip()
        except OSError:
            pass
    platform = platform_of(files["--platform-of"]) if files["--platform-of"] else None
    print(json.dumps({"candidates": candidates(args, files["--stamp"], packages), "recorded": recorded,
                      "platform": platform}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
