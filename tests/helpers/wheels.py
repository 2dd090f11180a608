"""A pure-Python wheel made with zipfile (no build backend, no index): what a planted or stale wheel in a
wheelhouse looks like to pip."""

from __future__ import annotations

import zipfile
from pathlib import Path


def pure_wheel(folder: Path, project: str, version: str, body: str = "") -> Path:
    """`<project>-<version>-py3-none-any.whl` in folder: one module named after the project (`VERSION` and
    `body`), with the METADATA, WHEEL and RECORD pip reads."""
    module = project.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {f"{module}.py": f"VERSION = {version!r}\n__version__ = VERSION\n{body}",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {project}\nVersion: {version}\n",
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: ddplab-tests\nRoot-Is-Purelib: true\n"
                              "Tag: py2-none-any\nTag: py3-none-any\n"}
    path = folder / f"{module}-{version}-py2.py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{dist}/RECORD", "".join(f"{name},,\n" for name in [*files, f"{dist}/RECORD"]))
    return path
