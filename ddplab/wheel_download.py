"""pip download for the wheelhouse (ddplab/wheelhouse.py `fill`): the wheels one node Python (version,
machine, glibc) installs, fetched on the control host. Each call echoes pip's messages as they come and
returns the names of the wheels pip saved or found already in the folder (what that download needs).

The user's requirements are resolved with `torch==<pin>+cpu` as a constraint (never a CUDA torch). A package
with only a source release is built into a wheel on the control host (`pip wheel`), then the download is
tried again with the built wheel in reach; when it cannot be built, or the built wheel does not install on
the node's Python, one message names the package and the fix.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename

# pip's own words for a wheel it wrote to --dest, or one the folder had already (pip/_internal/operations)
SAVED = re.compile(r"^\s*(?:Saved|File was already downloaded) (\S+\.whl)\s*$", re.M)
NO_MATCH = re.compile(r"No matching distribution found for (.+?)\s*$", re.M)
TORCH = "torch"


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


def target_args(folder: Path, python: str, machine: str, glibc: str) -> list[str]:
    """`pip download` for another machine's Python: wheels only, its interpreter, ABI and platforms."""
    major, minor = python_tag(python)
    argv = [sys.executable, "-m", "pip", "download", "--dest", str(folder), "--only-binary=:all:",
            "--implementation", "cp", "--python-version", f"{major}.{minor}", "--abi", f"cp{major}{minor}",
            "--progress-bar", "off", "--retries", "2"]
    for plat in linux_platforms(machine, glibc):
        argv += ["--platform", plat]
    return argv


def run_pip(argv: list[str], cwd: Path | None = None) -> tuple[int, list[str], str]:
    """Run pip, echoing its output line by line; (exit code, wheel file names it saved or found, output)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd)
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    rc = proc.wait()
    text = "".join(lines)
    return rc, sorted({Path(p).name for p in SAVED.findall(text)}), text


def download_torch(folder: Path, python: str, machine: str, glibc: str, torch: str, packages: list[str],
                   torch_index: str, cuda_fallback: bool = False) -> list[str]:
    """The CPU torch (`+cpu`, from torch_index) and `packages` for one node Python. With `cuda_fallback`, a
    Python whose `+cpu` wheel cannot be had gets PyPI's torch of the same version instead: the CUDA build,
    with the NVIDIA libraries it links against (about 2.8 GB more; it runs on CPU: docs/laptops.md)."""
    argv = target_args(folder, python, machine, glibc)
    if torch_index:
        argv += ["--extra-index-url", torch_index]
    argv += [f"torch=={torch}+cpu", *packages]
    print(f"ddplab: wheelhouse: python {python} {machine} (glibc >= {glibc}): "
          f"pip download torch=={torch}+cpu {' '.join(packages)}", flush=True)
    rc, wheels, _ = run_pip(argv)
    if rc != 0 and cuda_fallback:
        print(f"ddplab: wheelhouse: warning: no torch=={torch}+cpu for python {python} {machine}; "
              f"CUDA_FALLBACK: PyPI's torch=={torch} (the CUDA build and its NVIDIA libraries, ~2.8 GB) "
              "instead", flush=True)
        rc, wheels, _ = run_pip(target_args(folder, python, machine, glibc) + [f"torch=={torch}", *packages])
    if rc != 0:
        raise WheelhouseError(f"{folder}: pip download for python {python} {machine} failed (exit {rc}, its "
                              f"messages above); a CPU torch {torch} for that Python must be reachable; fix: "
                              f"check the network or --torch-index ({torch_index or 'none'}), or, where only "
                              "PyPI is reachable, make wheelhouse CUDA_FALLBACK=1 (PyPI's CUDA build, "
                              "~2.8 GB more)")
    return wheels


def project(requirement: str) -> str:
    """The canonical project name of a requirement as pip prints it ("foo>=1.0" -> "foo")."""
    try:
        return canonicalize_name(Requirement(requirement).name)
    except InvalidRequirement:
        return canonicalize_name(re.split(r"[^A-Za-z0-9._-]", requirement, maxsplit=1)[0])


def wheel_project(filename: str) -> str:
    try:
        return canonicalize_name(parse_wheel_filename(filename)[0])
    except InvalidWheelFilename:
        return ""


def build_wheel(folder: Path, requirements: Path, constraints: Path, name: str,
                torch_index: str) -> list[str]:
    """Build the wheels of the requirements on the control host (pip wheel, this host's Python) and move
    those of project `name` into the folder; their file names ([] when pip could not build them)."""
    with tempfile.TemporaryDirectory(prefix=".build-", dir=folder) as tmp:
        argv = [sys.executable, "-m", "pip", "wheel", "--wheel-dir", tmp, "--progress-bar", "off",
                "--find-links", str(folder), "-r", str(requirements), "-c", str(constraints)]
        if torch_index:
            argv += ["--extra-index-url", torch_index]
        print(f"ddplab: wheelhouse: {name} has no wheel on the index: building one on this host (pip wheel)",
              flush=True)
        rc, _, _ = run_pip(argv, cwd=requirements.parent)
        built = [p for p in Path(tmp).glob("*.whl") if wheel_project(p.name) == name]
        if rc != 0 or not built:
            return []
        for p in built:
            shutil.move(str(p), folder / p.name)
        return sorted(p.name for p in built)


def download_requirements(folder: Path, requirements: Path, python: str, machine: str, glibc: str, torch: str,
                          torch_index: str) -> list[str]:
    """The wheels the requirements file needs on this Python, torch's own left out (the node has the pin)."""
    with tempfile.NamedTemporaryFile("w", prefix="ddplab-torch-pin-", suffix=".txt") as pin:
        pin.write(f"{TORCH}=={torch}+cpu\n")
        pin.flush()
        argv = target_args(folder, python, machine, glibc) + ["--find-links", str(folder)]
        if torch_index:
            argv += ["--extra-index-url", torch_index]
        argv += ["-r", str(requirements), "-c", pin.name]
        print(f"ddplab: wheelhouse: python {python} {machine} (glibc >= {glibc}): pip download -r "
              f"{requirements} (torch=={torch}+cpu as a constraint)", flush=True)
        built: dict[str, list[str]] = {}
        while True:
            rc, wheels, text = run_pip(argv, cwd=requirements.parent)  # where the node's pip runs
            if rc == 0:
                return [w for w in wheels if wheel_project(w) != TORCH]
            missing = NO_MATCH.findall(text)
            if not missing:
                raise WheelhouseError(f"{requirements}: pip download for python {python} {machine} failed "
                                      f"(exit {rc}, its messages above); fix: check the network and the "
                                      "file's lines")
            name = project(missing[-1])
            if name in built:
                raise WheelhouseError(
                    f"{requirements}: {name} has only a source release and the wheel built on this host "
                    f"({', '.join(built[name])}) does not install on python {python} {machine}; fix: build "
                    f"it on such a machine (pip wheel --no-deps '{missing[-1]}'), copy the wheel into "
                    f"{folder} and run make wheelhouse again, or require a version of it that has a wheel")
            built[name] = build_wheel(folder, requirements, Path(pin.name), name, torch_index)
            if not built[name]:
                raise WheelhouseError(
                    f"{requirements}: {missing[-1]} has no wheel for python {python} {machine} and none "
                    "could be built on this host (pip wheel, its messages above); fix: check the name and "
                    f"version, install what building {name} needs on this host (a compiler, headers) and "
                    "run make wheelhouse again, or require a version that has a wheel")
