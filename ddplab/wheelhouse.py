"""The control host's wheelhouse: the pinned CPU torch and its dependencies, downloaded once, pushed to the
nodes over the LAN and installed offline there (`pip install --no-index --find-links`).

    python -m ddplab.wheelhouse fill --dir wheelhouse [--python 3.11 ...] [-i INVENTORY]
    python -m ddplab.wheelhouse select --dir wheelhouse --python 3.11 --machine x86_64 --glibc 2.36

`fill` downloads, for each Python version (the control host's, those given with --python, and those found
on the nodes of -i INVENTORY), `torch==<version>+cpu` (a CPU build only: a torch without the `+cpu` local
part is a multi-GB CUDA build), numpy, pyarrow and torch's own dependencies, then writes manifest.json
(file, size, sha256). `select` prints, as JSON, the files of the manifest a node can install (by its
Python version, machine and glibc), their total size and the torch wheel among them; prepare pushes
those (only what changed) and installs them offline.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import re
import subprocess
import sys
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

MANIFEST = "manifest.json"
DEFAULT_TORCH = "2.13.0"
DEFAULT_PACKAGES = ("numpy", "pyarrow")
# download.pytorch.org holds the +cpu builds for every Python version; PyPI's Linux torch is the CUDA one.
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
DEFAULT_GLIBC = "2.28"  # torch 2.13's Linux wheels are manylinux_2_28: the oldest glibc they run on
PROBE = ("import platform, sys; "
         "print('%d.%d' % sys.version_info[:2], platform.machine(), platform.libc_ver()[1])")


class WheelhouseError(Exception):
    """Bad input or a failed download; the message is the whole story."""


def python_tag(version: str) -> tuple[int, int]:
    m = re.fullmatch(r"3\.(\d{1,2})", version.strip())
    if not m:
        raise WheelhouseError(f"python version '{version}' is not usable; allowed: 3.N such as 3.11; "
                              "fix: pass --python 3.11")
    return 3, int(m.group(1))


def linux_platforms(machine: str, glibc: str) -> list[str]:
    """Platform tags a Linux node with this machine and glibc installs, newest first (PEP 600 + aliases)."""
    m = re.fullmatch(r"2\.(\d+)", glibc.strip())
    if not m:
        raise WheelhouseError(f"glibc version '{glibc}' is not usable; allowed: 2.N such as 2.36; "
                              "fix: a glibc-based Linux (Debian, Ubuntu, Fedora), not musl (Alpine)")
    minor = int(m.group(1))
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    plats = []
    for v in range(minor, 4, -1):
        plats.append(f"manylinux_2_{v}_{machine}")
        if v in aliases:
            plats.append(f"{aliases[v]}_{machine}")
    return plats + [f"linux_{machine}"]


def node_tags(python: str, machine: str, glibc: str) -> set[Tag]:
    version = python_tag(python)
    plats = linux_platforms(machine, glibc)
    interp = f"cp{version[0]}{version[1]}"
    return set(cpython_tags(version, platforms=plats)) | set(
        compatible_tags(version, interpreter=interp, platforms=plats))


def wheel_fits(filename: str, tags: set[Tag]) -> bool:
    try:
        _, _, _, wheel_tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return False
    return not wheel_tags.isdisjoint(tags)


def select(manifest: dict, python: str, machine: str, glibc: str) -> dict:
    """The manifest's files this node installs, their total size and the torch wheel among them."""
    tags = node_tags(python, machine, glibc)
    files = [f for f in manifest["files"] if wheel_fits(f["file"], tags)]
    torch = next((f["file"] for f in files if f["file"].startswith("torch-")), None)
    return {"files": files, "bytes": sum(f["size"] for f in files), "torch": torch,
            "python": python, "machine": machine, "glibc": glibc}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_manifest(folder: Path, torch: str) -> dict:
    """manifest.json lists every wheel of the folder; sha256 is reused for files already listed."""
    old_path = folder / MANIFEST
    old = {f["file"]: f for f in json.loads(old_path.read_text())["files"]} if old_path.exists() else {}
    files = []
    for p in sorted(folder.glob("*.whl")):
        size = p.stat().st_size
        prior = old.get(p.name)
        digest = prior["sha256"] if prior and prior["size"] == size else sha256(p)
        files.append({"file": p.name, "size": size, "sha256": digest})
    manifest = {"torch": torch, "files": files}
    old_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def node_pythons(inventory: str, ansible: str) -> set[tuple[str, str, str]]:
    """(python, machine, glibc) of every node of an inventory, read with one ad-hoc Ansible command."""
    argv = [ansible, "-i", inventory, "ddplab_nodes", "-o", "-m", "ansible.builtin.command",
            "-a", f'python3 -c "{PROBE}"']
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    found, failed = set(), []
    for line in out.stdout.splitlines():
        m = re.match(r"^(\S+) \| (\w+).*?\(stdout\) (3\.\d+) (\S+) (2\.\d+)\s*$", line)
        if m:
            found.add((m.group(3), m.group(4), m.group(5)))
        elif " | " in line:
            failed.append(line.split(" | ")[0])
    if failed or out.returncode != 0:
        names = ", ".join(failed) or out.stderr.strip().splitlines()[-1:] or ["?"]
        raise WheelhouseError(f"{inventory}: could not read the Python version of {names}; "
                              "every node must answer over SSH with python3; fix the node or pass --python")
    return found


def download(folder: Path, python: str, machine: str, glibc: str, torch: str, packages: list[str],
             torch_index: str) -> None:
    major, minor = python_tag(python)
    argv = [sys.executable, "-m", "pip", "download", "--dest", str(folder), "--only-binary=:all:",
            "--implementation", "cp", "--python-version", f"{major}.{minor}", "--abi", f"cp{major}{minor}",
            "--progress-bar", "off", "--retries", "2"]
    for plat in linux_platforms(machine, glibc):
        argv += ["--platform", plat]
    if torch_index:
        argv += ["--extra-index-url", torch_index]
    argv += [f"torch=={torch}+cpu", *packages]
    print(f"ddplab: wheelhouse: python {python} {machine} (glibc >= {glibc}): "
          f"pip download torch=={torch}+cpu {' '.join(packages)}", flush=True)
    done = subprocess.run(argv, text=True, check=False)
    if done.returncode != 0:
        raise WheelhouseError(f"{folder}: pip download for python {python} {machine} failed (exit "
                              f"{done.returncode}, its messages above); a CPU torch {torch} for that Python "
                              f"must be reachable; fix: check the network or --torch-index "
                              f"({torch_index or 'none'})")


def fill(args: argparse.Namespace) -> int:
    folder = Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    here = (f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine(), DEFAULT_GLIBC)
    targets = {here} | {(p, args.machine or here[1], DEFAULT_GLIBC) for p in args.python}
    if args.inventory:
        targets |= {(py, m, DEFAULT_GLIBC) for py, m, _ in node_pythons(args.inventory, args.ansible)}
    for python, machine, glibc in sorted(targets):
        download(folder, python, machine, glibc, args.torch, args.package, args.torch_index)
    manifest = write_manifest(folder, args.torch)
    total = sum(f["size"] for f in manifest["files"])
    print(f"ddplab: wheelhouse: {folder}: {len(manifest['files'])} wheels, {total / 1e6:.0f} MB, for "
          f"{', '.join(f'python {p} {m}' for p, m, _ in sorted(targets))}")
    return 0


def select_cmd(args: argparse.Namespace) -> int:
    path = Path(args.dir) / MANIFEST
    if not path.exists():
        raise WheelhouseError(f"{path}: not found; the wheelhouse holds the torch every node installs; "
                              "fix: make wheelhouse")
    print(json.dumps(select(json.loads(path.read_text()), args.python, args.machine, args.glibc)))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddplab.wheelhouse", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fill", help="download torch and its dependencies for the nodes' Pythons")
    f.add_argument("--dir", required=True, help="the wheelhouse folder (ddplab_wheelhouse_dir)")
    f.add_argument("--python", action="append", default=[], help="a node Python version, e.g. 3.11 (repeat)")
    f.add_argument("--machine", default="", help="node machine for --python (default: this host's)")
    f.add_argument("-i", "--inventory", default="", help="read the nodes' Pythons from it")
    f.add_argument("--ansible", default=str(Path(sys.executable).with_name("ansible")), help="ansible")
    f.add_argument("--torch", default=DEFAULT_TORCH, help="torch version (its +cpu build)")
    f.add_argument("--package", action="append", default=list(DEFAULT_PACKAGES), help="another package")
    f.add_argument("--torch-index", default=DEFAULT_TORCH_INDEX, help="extra index with the +cpu builds")
    s = sub.add_parser("select", help="print the wheels a node installs (JSON)")
    s.add_argument("--dir", required=True)
    s.add_argument("--python", required=True)
    s.add_argument("--machine", required=True)
    s.add_argument("--glibc", required=True)
    args = ap.parse_args(argv)
    try:
        return fill(args) if args.cmd == "fill" else select_cmd(args)
    except WheelhouseError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
