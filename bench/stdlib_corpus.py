"""A real, hard corpus on every machine without a download: the running Python's standard library source.

    write_source(Path("runs/x/source"))  # -> runs/x/source/stdlib.jsonl, then `python -m trainer.data
                                         #    prepare --source runs/x/source --out DIR` reads it

The `*.py` files under `sysconfig.get_paths()["stdlib"]` (sorted paths, so the same interpreter gives the
same bytes), without tests, third-party packages, generated tables and the GUI/demo folders, up to
MAX_BYTES of source. Each file is cut at line ends into documents of about CHUNK_BYTES, so the held-out
row groups of a shard set hold pieces of many files (a validation piece's file may have other pieces in
training; the pieces themselves are never trained on). Code with English docstrings, read as bytes, is far
harder to learn than the trainer's templated built-in corpus.
"""

from __future__ import annotations

import json
import os
import platform
import sysconfig
from pathlib import Path

MAX_BYTES = 12_000_000  # of source read; CPython 3.11 gives ~8.5 MB after the skips
CHUNK_BYTES = 2048  # a document is the lines of one file up to at least this many bytes
SKIP_DIRS = {"test", "tests", "idle_test",  # the test suites
             "site-packages", "dist-packages", "__pycache__",  # installed packages, bytecode
             "encodings", "pydoc_data",  # generated codec tables, a 750 KB string of help text
             "idlelib", "tkinter", "turtledemo", "lib2to3"}  # GUI, demos, a deprecated tool with test data
SKIP_DIR_PREFIXES = ("config-",)  # this build's configuration (Makefile, python-config.py)
SKIP_FILE_PREFIXES = ("test_", "_sysconfigdata")  # stray tests; this build's generated configuration
SOURCE_FILE = "stdlib.jsonl"


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path, max_bytes: int) -> list[Path]:
    """The kept `*.py` files under root, sorted, up to (not past) max_bytes in all."""
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith(SKIP_DIR_PREFIXES)]  # pruned
        found += [Path(folder, n) for n in names
                  if n.endswith(".py") and not n.startswith(SKIP_FILE_PREFIXES)]
    out, total = [], 0
    for p in sorted(found, key=lambda p: p.relative_to(root).as_posix()):
        size = p.stat().st_size
        if total + size > max_bytes:
            break
        out.append(p)
        total += size
    return out


def chunks(text: str, size: int) -> list[str]:
    """The text cut after line ends into pieces of at least `size` characters (the last may be shorter;
    a last piece of only blank lines is dropped)."""
    out, cur, n = [], [], 0
    for line in text.splitlines(keepends=True):
        cur.append(line)
        n += len(line)
        if n >= size:
            out.append("".join(cur))
            cur, n = [], 0
    if "".join(cur).strip():
        out.append("".join(cur))
    return out


def write_source(out: Path, root: Path | None = None, max_bytes: int = MAX_BYTES) -> dict:
    """Write out/SOURCE_FILE ({"text": ...} per document) from the stdlib under root; what it holds."""
    root = root or stdlib_root()
    files = stdlib_files(root, max_bytes)
    docs = [c for p in files for c in chunks(p.read_text(encoding="utf-8", errors="replace"), CHUNK_BYTES)]
    out.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    path = out / SOURCE_FILE
    if not path.exists() or path.read_text(encoding="utf-8") != body:
        path.write_text(body, encoding="utf-8")
    return {"python": platform.python_version(), "root": str(root), "files": len(files),
            "source_bytes": sum(p.stat().st_size for p in files), "documents": len(docs),
            "chunk_bytes": CHUNK_BYTES, "max_bytes": max_bytes}
