"""The control host's wheelhouse: the pinned CPU torch and its dependencies, and the wheels of the user's
requirements file, downloaded once, pushed to the nodes over the LAN and installed offline there
(`pip install --no-index --require-hashes`: only the manifest's files, each with its sha256, can install).

    python -m ddplab.wheelhouse fill --dir wheelhouse [--python 3.11 ...] [-i INVENTORY] [--requirements FILE]
    python -m ddplab.wheelhouse select --dir wheelhouse --python 3.11 --machine x86_64 --glibc 2.36 \
        [--requirements FILE --installed-on-stdin]

`fill` downloads, for each Python version (the control host's, those given with --python, and those found
on the nodes of -i INVENTORY), `torch==<version>+cpu` (a CPU build only: a torch without the `+cpu` local
part is a multi-GB CUDA build), numpy, pyarrow and torch's own dependencies; then, for the requirements file
(--requirements, else the inventory's ddplab_code_dir/ddplab_pip_requirements; a line asking for another
torch is refused first), its wheels with that torch as a constraint (ddplab/wheel_download.py). It writes
manifest.json: every wheel (file, size, sha256), the torch wheels per Python (`torch_wheels`) and the
requirements record (file, sha256, torch, wheels per Python). `select` prints, as JSON, the torch wheels a
node can install (by its Python version, machine and glibc), their total size and the torch wheel among
them; with --requirements, the requirement wheels it installs offline, or `offline: false` and the reason
with the fix (`make wheelhouse`) when the file changed since the fill, was never filled or the node's Python
was not filled. Both answers carry `hashed`: pip's requirements-with-hashes text (`name==version
--hash=sha256:...`) of the wheels that node installs, so a stale or planted wheel in the node's copy of the
wheelhouse (another version, or the same name with other bytes) is never installed. prepare pushes the
wheels (only what the node lacks) and installs them offline from that text (`--no-index --require-hashes`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ddplab.check_requirements import problems as torch_problems
from ddplab.settings.external import CPU_INDEX
from ddplab.settings.spec import BY_NAME
from ddplab.wheel_download import (
    WheelhouseError,
    download_requirements,
    download_torch,
    linux_platforms,
    python_tag,
)
from nodeprobe.hashing import sha256_file

MANIFEST = "manifest.json"
DEFAULT_TORCH = BY_NAME["ddplab_torch_version"].default
DEFAULT_PACKAGES = ("numpy", "pyarrow")
# download.pytorch.org holds the +cpu builds for every Python version; PyPI's Linux torch is the CUDA one.
DEFAULT_TORCH_INDEX = CPU_INDEX
DEFAULT_GLIBC = "2.28"  # torch 2.13's Linux wheels are manylinux_2_28: the oldest glibc they run on
# The Python a node's new venv is made from (roles/torch_env's torch_env_base_python): its version, machine
# and glibc choose the wheels the node installs.
VENV_PYTHON = "python3"
REPO = Path(__file__).resolve().parents[1]  # its ansible.cfg names the ddplab_node action (plugins/action)
# ddplab's own ansible (the venv's), beside this Python; --ansible names another.
DEFAULT_ANSIBLE = str(Path(sys.executable).with_name("ansible"))


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


def hashed_requirements(files: list[dict]) -> str:
    """pip's requirements-with-hashes text for these manifest entries ({file, sha256}): one line per project,
    `name==version` with the sha256 of each of its wheels (a wheel per Python tag may share a version). With
    several versions of one project (an older fill left its wheel), the highest is kept, as pip would pick."""
    by_project: dict[str, dict[Version, list[str]]] = {}
    for f in files:
        name, version, _, _ = parse_wheel_filename(f["file"])
        by_project.setdefault(canonicalize_name(name), {}).setdefault(version, []).append(f["sha256"])
    lines = []
    for name in sorted(by_project):
        version = max(by_project[name])
        hashes = " ".join(f"--hash=sha256:{h}" for h in sorted(set(by_project[name][version])))
        lines.append(f"{name}=={version} {hashes}\n")
    return "".join(lines)


def target(python: str, machine: str) -> str:
    """The manifest's key for the wheels one node Python takes: "3.11 x86_64"."""
    return f"{python} {machine}"


def select(manifest: dict, python: str, machine: str, glibc: str) -> dict:
    """The torch wheels this node installs (those the torch download for its Python took, when the manifest
    records them; else those of the manifest that fit it, less the wheels only the requirements' downloads
    took), their total size, the torch wheel among them and their requirements-with-hashes text."""
    tags = node_tags(python, machine, glibc)
    theirs = {n for names in manifest.get("requirements", {}).get("wheels", {}).values() for n in names}
    ours = {n for names in manifest.get("torch_wheels", {}).values() for n in names}
    mine = manifest.get("torch_wheels", {}).get(target(python, machine))
    files = [f for f in manifest["files"] if wheel_fits(f["file"], tags)
             and (f["file"] in mine if mine is not None else f["file"] not in theirs - ours)]
    torch = next((f["file"] for f in files if f["file"].startswith("torch-")), None)
    return {"files": files, "bytes": sum(f["size"] for f in files), "torch": torch,
            "hashed": hashed_requirements(files), "python": python, "machine": machine, "glibc": glibc}


def installed_already(filename: str, installed: set[tuple[str, str]]) -> bool:
    """The node's Python has this wheel's project at this very version (its pip would keep it)."""
    name, version, _, _ = parse_wheel_filename(filename)
    return (canonicalize_name(name), str(version)) in installed


def select_requirements(manifest: dict, requirements: Path, python: str, machine: str, glibc: str,
                        installed: set[tuple[str, str]] = frozenset()) -> dict:
    """The wheels this node installs the requirements file from, offline, less those it has installed at that
    version already (`installed`: (canonical name, version)), and `hashed`: the pip requirements-with-hashes
    text of every wheel recorded for it (those installed already are kept by pip). `offline` false: the
    wheelhouse does not serve this file on this node; `warning` says why (never filled, changed file,
    another Python) with the fix; the role refuses then unless ddplab_pip_index_fallback lets pip read the
    index."""
    out = {"files": [], "bytes": 0, "hashed": "", "python": python, "machine": machine, "glibc": glibc,
           "offline": False, "warning": ""}
    index = ("(a node reads a package index only with ddplab_pip_index_fallback=true); "
             "fix: make wheelhouse INV=<your inventory>")
    other_python = index + f' (or PYTHONS="{python}")'
    record = manifest.get("requirements")
    if not record:
        return {**out, "warning": f"the wheelhouse has no wheels of {requirements} {index}"}
    if sha256_file(requirements, use_cache=False) != record["sha256"]:
        return {**out, "warning": f"{requirements} changed since make wheelhouse downloaded its wheels (for "
                                  f"{record['file']}, sha256 {record['sha256'][:12]}) {index}"}
    names = record["wheels"].get(target(python, machine))
    if names is None:
        return {**out, "warning": f"the wheelhouse has the wheels of {requirements} for python "
                                  f"{', '.join(sorted(record['wheels']))}, not for this node's python "
                                  f"{target(python, machine)} {other_python}"}
    by_name = {f["file"]: f for f in manifest["files"]}
    tags = node_tags(python, machine, glibc)
    unusable = [n for n in names if n not in by_name or not wheel_fits(n, tags)]
    if unusable:
        return {**out, "warning": f"the wheelhouse's wheels of {requirements} for python "
                                  f"{target(python, machine)} lack or do not fit this node (glibc {glibc}): "
                                  f"{', '.join(unusable)} {index}"}
    files = [by_name[n] for n in names if not installed_already(n, installed)]
    return {**out, "files": files, "bytes": sum(f["size"] for f in files), "offline": True,
            "hashed": hashed_requirements([by_name[n] for n in names])}


def node_installed(text: str) -> set[tuple[str, str]]:
    """(canonical name, normalized version) of the node's distributions, from site_probe's `installed`."""
    out = set()
    for name, version in json.loads(text or "[]"):
        try:
            out.add((canonicalize_name(name), str(Version(version))))
        except InvalidVersion:
            continue
    return out


def merged_requirements(old: dict | None, new: dict | None) -> dict | None:
    """The requirements record after a fill: the new downloads, plus the old ones for other Pythons when they
    were made for the same file content and torch."""
    if new is None:
        return old
    if old and (old["sha256"], old["torch"]) == (new["sha256"], new["torch"]):
        return {**new, "wheels": {**old["wheels"], **new["wheels"]}}
    return new


def write_manifest(folder: Path, torch: str, torch_wheels: dict[str, list[str]] | None = None,
                   requirements: dict | None = None) -> dict:
    """manifest.json lists every wheel of the folder (sha256 reused for files already listed), the torch
    wheels each Python's download took (`torch_wheels`) and, once a requirements file was filled, what
    for: `requirements` {file, sha256, torch, wheels: {"3.11 x86_64": [...]}}."""
    old_path = folder / MANIFEST
    old = json.loads(old_path.read_text()) if old_path.exists() else {}
    known = {f["file"]: f for f in old.get("files", [])}
    files = []
    for p in sorted(folder.glob("*.whl")):
        size = p.stat().st_size
        prior = known.get(p.name)
        digest = prior["sha256"] if prior and prior["size"] == size else sha256_file(p, use_cache=False)
        files.append({"file": p.name, "size": size, "sha256": digest})
    manifest: dict = {"torch": torch, "files": files}
    if torch_wheels is not None:
        kept = old.get("torch_wheels", {}) if old.get("torch") == torch else {}
        manifest["torch_wheels"] = {**kept, **torch_wheels}
    reqs = merged_requirements(old.get("requirements"), requirements)
    if reqs:
        manifest["requirements"] = reqs
    old_path.write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def run_ansible(argv: list[str], timeout: float, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """An ad-hoc ansible command (argv[0] is --ansible). ddplab's plugins import ddplab: its folder goes
    first on PYTHONPATH, so an ansible installed outside ddplab's venv loads them too."""
    path = os.pathsep.join(filter(None, (str(REPO), os.environ.get("PYTHONPATH"))))
    env = {**os.environ, "PYTHONPATH": path}
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd,
                              env=env)
    except OSError as e:
        raise WheelhouseError(f"--ansible {argv[0]}: cannot run it ({e.strerror}); fix: name an ansible "
                              f"command, or leave --ansible out to use ddplab's ({DEFAULT_ANSIBLE})") \
            from None


def ansible_value(inventory: str, ansible: str, expression: str):
    """A Jinja expression over the first node's variables, templated as a playbook would (no connection)."""
    argv = [ansible, "-i", inventory, "ddplab_nodes[0]", "-o", "-m", "ansible.builtin.debug",
            "-a", f"msg={{{{ ({expression}) | to_json }}}}"]
    out = run_ansible(argv, timeout=120)
    m = re.search(r"=> (\{.*\})\s*$", out.stdout, re.M)
    if out.returncode != 0 or not m:
        raise WheelhouseError(f"{inventory}: could not read {expression} from the inventory "
                              f"({(out.stdout + out.stderr).strip().splitlines()[-1:]}); fix the inventory "
                              "or pass --requirements FILE")
    return json.loads(json.loads(m.group(1))["msg"])


def inventory_requirements(inventory: str, ansible: str) -> Path | None:
    """The control host's copy of the inventory's ddplab_pip_requirements (in ddplab_code_dir), or None."""
    code, req = ansible_value(inventory, ansible,
                              "[ddplab_code_dir | default(''), ddplab_pip_requirements | default('')]")
    if not req:
        return None
    path = Path(code or ".") / req
    if not code or not path.is_file():
        raise WheelhouseError(f"{inventory}: ddplab_pip_requirements {req} is not a file of ddplab_code_dir "
                              f"{code or '(empty)'} on this host; fix the two settings, or pass "
                              "--requirements FILE")
    return path


def node_pythons(inventory: str, ansible: str) -> set[tuple[str, str, str]]:
    """(python, machine, glibc) of every node of an inventory: nodeprobe's site-probe run by each node's
    python3, the one way node code runs (the ddplab_node action, ddplab/node_command.py), in one ad-hoc
    Ansible command."""
    where = Path(inventory)
    argv = [ansible, "-i", str(where.resolve()) if where.exists() else inventory, "ddplab_nodes", "-o",
            "-m", "ddplab_node", "-a", f"nodeprobe=site-probe python={VENV_PYTHON}"]
    out = run_ansible(argv, timeout=300, cwd=REPO)
    found, failed = set(), []
    for line in out.stdout.splitlines():
        if " | " not in line:
            continue
        platform_of = node_platform(line)
        if platform_of:
            found.add(platform_of)
        else:
            failed.append(line.split(" | ")[0])
    if not failed and not found and out.returncode != 0:  # no node answered: ansible itself did not run
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise WheelhouseError(f"{inventory}: {ansible} did not run ddplab's ddplab_node action ({said[0]}); "
                              f"fix: leave --ansible out to use ddplab's own ansible ({DEFAULT_ANSIBLE}), "
                              "or pass --python")
    if failed or out.returncode != 0:
        names = ", ".join(failed) or "?"
        raise WheelhouseError(f"{inventory}: could not read the Python version of {names}; every node must "
                              f"answer over SSH with {VENV_PYTHON}; fix the node or pass --python")
    return found


def node_platform(line: str) -> tuple[str, str, str] | None:
    """(python, machine, glibc) from one host's line of `ansible -o` running site-probe, or None when the
    node did not answer with them."""
    m = re.match(r"^\S+ \| CHANGED => (\{.*\})\s*$", line)
    try:
        parts = json.loads(json.loads(m.group(1))["stdout"])["platform"].split() if m else []
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if len(parts) != 3 or not re.fullmatch(r"3\.\d+", parts[0]) or not re.fullmatch(r"2\.\d+", parts[2]):
        return None
    return parts[0], parts[1], parts[2]


def requirements_file(args: argparse.Namespace) -> Path | None:
    """--requirements FILE, else the inventory's; a line asking for another torch is refused here too."""
    if args.requirements:
        path = Path(args.requirements)
        if not path.is_file():
            raise WheelhouseError(f"--requirements {path}: no such file; fix: name your requirements file")
    elif args.inventory:
        path = inventory_requirements(args.inventory, args.ansible)
    else:
        return None
    if path is not None:
        found = torch_problems(str(path), args.torch, set())
        if found:
            raise WheelhouseError(found[0])
    return path.resolve() if path else None


def fill(args: argparse.Namespace) -> int:
    folder = Path(args.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    requirements = requirements_file(args)
    here = (f"{sys.version_info[0]}.{sys.version_info[1]}", platform.machine(), DEFAULT_GLIBC)
    targets = {here} | {(p, args.machine or here[1], DEFAULT_GLIBC) for p in args.python}
    if args.inventory:
        targets |= {(py, m, DEFAULT_GLIBC) for py, m, _ in node_pythons(args.inventory, args.ansible)}
    torch_wheels, req_wheels = {}, {}
    for python, machine, glibc in sorted(targets):
        torch_wheels[target(python, machine)] = download_torch(folder, python, machine, glibc, args.torch,
                                                               args.package, args.torch_index,
                                                               args.cuda_fallback)
        if requirements:
            req_wheels[target(python, machine)] = download_requirements(
                folder, requirements, python, machine, glibc, args.torch, args.torch_index)
    record = ({"file": str(requirements), "sha256": sha256_file(requirements, use_cache=False),
               "torch": args.torch, "wheels": req_wheels} if requirements else None)
    manifest = write_manifest(folder, args.torch, torch_wheels, record)
    total = sum(f["size"] for f in manifest["files"])
    print(f"ddplab: wheelhouse: {folder}: {len(manifest['files'])} wheels, {total / 1e6:.0f} MB, for "
          f"{', '.join(f'python {p} {m}' for p, m, _ in sorted(targets))}"
          + (f"; {requirements}: {len(set().union(*req_wheels.values()))} wheels" if requirements else ""))
    return 0


def select_cmd(args: argparse.Namespace) -> int:
    path = Path(args.dir) / MANIFEST
    if args.requirements:  # no wheelhouse: not offline, with the reason (the role refuses or reads the index)
        manifest = json.loads(path.read_text()) if path.exists() else {}
        installed = node_installed(sys.stdin.read()) if args.installed_on_stdin else set()
        print(json.dumps(select_requirements(manifest, Path(args.requirements), args.python, args.machine,
                                             args.glibc, installed)))
        return 0
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
    f.add_argument("-i", "--inventory", default="", help="read the nodes' Pythons and requirements from it")
    f.add_argument("--requirements", default="", help="a requirements file (default: the inventory's "
                   "ddplab_code_dir/ddplab_pip_requirements)")
    f.add_argument("--ansible", default=DEFAULT_ANSIBLE, help="the ansible command that reads the nodes")
    f.add_argument("--torch", default=DEFAULT_TORCH, help="torch version (its +cpu build)")
    f.add_argument("--package", action="append", default=list(DEFAULT_PACKAGES), help="another package")
    f.add_argument("--torch-index", default=DEFAULT_TORCH_INDEX, help="extra index with the +cpu builds")
    f.add_argument("--cuda-fallback", action="store_true",
                   help="a Python with no reachable +cpu torch gets PyPI's (CUDA) build of that version")
    s = sub.add_parser("select", help="print the wheels a node installs (JSON)")
    s.add_argument("--dir", required=True)
    s.add_argument("--python", required=True)
    s.add_argument("--machine", required=True)
    s.add_argument("--glibc", required=True)
    s.add_argument("--requirements", default="", help="the wheels of this requirements file, not torch's")
    s.add_argument("--installed-on-stdin", action="store_true",
                   help="stdin: JSON [[name, version], ...] the node has (nodeprobe/site_probe.py)")
    args = ap.parse_args(argv)
    try:
        return fill(args) if args.cmd == "fill" else select_cmd(args)
    except WheelhouseError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
