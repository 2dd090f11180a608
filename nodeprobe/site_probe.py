"""What the Python running this says about itself: shipped alone by roles/torch_env (requirements.yml) as the
program first on stdin (ddplab/node_command.py); stdlib only. `make wheelhouse INV=...` runs it too
(ddplab/wheelhouse.py: each node's python3, the wheels it takes).

Prints one JSON object: ``platform`` ("<major.minor> <machine> <glibc>", the wheels it installs), ``purelib``
(where pip installs into it), ``sites`` (its site folders, which a venv layered on it lists in a .pth file)
and ``installed`` ([[canonical name, version], ...] of the distributions it imports; a wheel of one of those
at that very version need not travel to the node).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import re
import site
import sys
import sysconfig


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> list[list[str]]:
    found = set()
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name:
            found.add((canonical(name), dist.version))
    return [list(pair) for pair in sorted(found)]


def probe() -> dict:
    major, minor = sys.version_info[:2]
    return {"platform": f"{major}.{minor} {platform.machine()} {platform.libc_ver()[1]}",
            "purelib": sysconfig.get_paths()["purelib"], "sites": site.getsitepackages(),
            "installed": installed()}


if __name__ == "__main__":
    print(json.dumps(probe()))
