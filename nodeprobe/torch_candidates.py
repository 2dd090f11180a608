"""Which interpreters on this node have exactly the lab's torch: run before any venv or synced code.

Shipped alone by roles/torch_env (``ansible.builtin.script``; stdlib only, no package imports):
``torch_candidates.py PYTHON...`` prints one JSON object ``{"candidates": [{"python": <path or the
name asked>, "torch": <version without +local, or null>}]}``. A candidate counts only when torch,
numpy and pyarrow all import (the trainer needs the three).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

IMPORT_CHECK = "import numpy, pyarrow, torch; print(torch.__version__.split('+')[0])"


def torch_version(python: str, timeout: float = 120) -> str | None:
    try:
        out = subprocess.run([python, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=timeout,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    return lines[-1] if out.returncode == 0 and lines else None


def candidates(pythons: list[str]) -> list[dict]:
    out = []
    for name in pythons:
        path = shutil.which(name)
        out.append({"python": path or name, "torch": torch_version(path) if path else None})
    return out


def main(argv=None) -> int:
    print(json.dumps({"candidates": candidates(sys.argv[1:] if argv is None else argv)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
