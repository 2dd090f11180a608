"""``python -m nodeprobe place-files < spec``: write small files ddplab keeps on a node (records, run
files), each only when its content or mode differs, atomically and with its mode from the first byte.

The spec is ``{"files": [{"path": ..., "content": ..., "mode": "0644"}]}``; prints ``{"changed": [paths]}``.
Each file is a text record that ends with a newline (added here when the content has none: Jinja in a
YAML task cannot spell one reliably).
One process for what would otherwise be one `copy` task (two SSH round trips) per file.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from nodeprobe.spec import read_spec


def write_file(path: Path, content: str, mode: int) -> None:
    """Atomically, and with its mode from the first byte (trainer.env may hold secrets: never 0644)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w") as f:
            f.write(content)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def place(path: Path, content: str, mode: int) -> bool:
    """Write ``path`` unless it already holds ``content`` with ``mode``; True when it was written."""
    try:
        same = path.read_text() == content and stat.S_IMODE(path.stat().st_mode) == mode
    except (OSError, UnicodeDecodeError):
        same = False
    if not same:
        write_file(path, content, mode)
    return not same


def place_files(spec: dict) -> dict:
    files = spec.get("files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and f.get("path") for f in files):
        raise ValueError("the spec needs files: [{path, content, mode}]")
    changed = []
    for f in files:
        content = str(f.get("content", ""))
        if not content.endswith("\n"):
            content += "\n"
        if place(Path(f["path"]), content, int(str(f.get("mode", "0644")), 8)):
            changed.append(f["path"])
    return {"probe": "place-files", "changed": changed}


def run(text: str) -> dict:
    return place_files(read_spec(text))
