"""``prereqs``: what roles/node_prereqs needs to know about a node, in one round trip (stdlib only).

Shipped alone as the program on stdin (``python3 - --path P --python PY --command NAME=PACKAGE ...``):
it runs before any ddplab code is on the node. Prints one JSON object: the system (``uname``), the
distribution from /etc/os-release and its family (``Debian`` for Debian, Ubuntu and their derivatives,
the only family whose packages ddplab installs), the commands found on PATH, and what is missing with
the Debian package that brings each; and whether ddplab_root can be the lab folder (not /, not the home
folder, not a folder with files that ddplab did not make). Replaces Ansible's fact gathering (0.6 s)
plus a second probe.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

# IDs (os-release ID or ID_LIKE words) of the Debian family, as Ansible's distribution facts group them
DEBIAN_IDS = {"debian", "ubuntu", "raspbian", "linuxmint", "pop", "kali", "devuan", "neon", "elementary",
              "zorin", "mx", "pureos", "parrot", "deepin", "uos", "kylin"}


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines (values optionally quoted) as a dict; comments and junk are skipped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key.strip()] = value
    return out


def os_family(release: dict[str, str]) -> str:
    """"Debian" for the Debian family, else the distribution's NAME (or "unknown")."""
    words = {release.get("ID", "").lower(), *release.get("ID_LIKE", "").lower().split()}
    if words & DEBIAN_IDS:
        return "Debian"
    return release.get("NAME") or "unknown"


def read_release(paths=("/etc/os-release", "/usr/lib/os-release")) -> dict[str, str]:
    for p in paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                return parse_os_release(f.read())
        except OSError:
            continue
    return {}


def missing(found: dict[str, str | None], commands: dict[str, str], venv_ok: bool, python: str,
            venv_package: str) -> tuple[list[str], list[str]]:
    """(missing commands, the packages that bring them), in the order given; packages without repeats."""
    cmds = [c for c in commands if not found.get(c)]
    pkgs = [commands[c] for c in cmds]
    if not venv_ok:
        cmds.append(f"{python} -m venv")
        pkgs.append(venv_package)
    return cmds, list(dict.fromkeys(pkgs))


# Written into ddplab_root when ddplab makes it (roles/ddplab/tasks/dirs.yml). A folder that holds files
# and none of these was not made by ddplab: it is refused, since syncs there write and prune.
ROOT_MARKER = ".ddplab-lab"
ROOT_MARKERS = (ROOT_MARKER, "code/.ddplab-code-files.json")  # the latter: labs made before the marker


def root_problem(root: str, home: str) -> str | None:
    """Why ``root`` (ddplab_root as given, ``~`` allowed) cannot be ddplab's lab folder, or None."""
    path = os.path.realpath(os.path.expanduser(root))
    if path == "/":
        return "is /"
    if path == os.path.realpath(home):
        return "is your home folder"
    if os.path.lexists(path) and not os.path.isdir(path):
        return "is not a folder"
    if os.path.isdir(path) and os.listdir(path) and not any(
            os.path.lexists(os.path.join(path, m)) for m in ROOT_MARKERS):
        return f"holds files and ddplab did not make it (no {ROOT_MARKER} in it)"
    return None


def venv_works(python: str, path: str) -> bool:
    exe = shutil.which(python, path=path)
    if not exe:
        return False
    try:
        # From "/": `-c` puts the working folder (the login folder) first on sys.path.
        return subprocess.run([exe, "-c", "import ensurepip, venv"], capture_output=True, timeout=60,
                              cwd="/", check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="prereqs")
    p.add_argument("--path", required=True, help="PATH to look for the commands on")
    p.add_argument("--python", default="python3", help="the Python that makes the venv")
    p.add_argument("--venv-package", default="python3-venv")
    p.add_argument("--command", action="append", default=[], metavar="NAME=PACKAGE")
    p.add_argument("--root", help="ddplab_root: say when it cannot be the lab folder")
    a = p.parse_args(argv)
    commands = dict(c.split("=", 1) for c in a.command)
    found = {c: shutil.which(c, path=a.path) for c in commands}
    venv_ok = venv_works(a.python, a.path)
    cmds, pkgs = missing(found, commands, venv_ok, a.python, a.venv_package)
    release = read_release()
    uname = os.uname()
    print(json.dumps({
        "system": uname.sysname, "machine": uname.machine,
        "distribution": release.get("NAME", "unknown"), "version": release.get("VERSION_ID", ""),
        "os_family": os_family(release), "found": found, "venv": venv_ok,
        "missing_cmds": cmds, "missing_pkgs": pkgs,
        "root": os.path.realpath(os.path.expanduser(a.root)) if a.root else None,
        "root_problem": root_problem(a.root, os.path.expanduser("~")) if a.root else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
