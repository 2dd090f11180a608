"""``python -m nodeprobe compile-seed pack|fingerprint|unpack < spec``: torch.compile's caches, warmed once
on the master, for every node whose ranks can load them.

torch.compile (inductor) on CPU builds C++ kernels with ``-march=native`` and loads them as shared
libraries from TORCHINDUCTOR_CACHE_DIR; a rank that finds its graphs there skips both the code generation
and the C++ compiler (nanochat d4: minutes cold, seconds warm). torch's own portable cache
(``torch.compiler.save_cache_artifacts``) does not carry those libraries on CPU in torch 2.13 (a rank that
loads it still builds every kernel), so the seed is the cache folder itself: the smoke run's ranks compiled
into ``<compile_cache>/smoke-rank<r>`` on the master; ``pack`` puts their plain files (not ``tmp/``, which
holds the precompiled headers, nor ``locks/``) into one tar, ``seed.tar``, 0600, the same bytes for the same
files (sorted, no times or owners), and reports its sha256 with the master's ``fingerprint``.

A library built for one CPU can crash on another (``-march=native``: an instruction the other CPU lacks),
and one built against one torch or Python cannot be loaded by another: the control host ships the seed only
to nodes whose ``fingerprint`` (torch version, Python, machine, C library, CPU flags) is the master's
(ddplab/compile_ship.py says why not for the others).

``unpack`` runs on a node the seed reached, before its ranks start: it reads the seed only when its sha256 is
the one the control host took from the master's bytes, refuses the whole tar when a member is anything but a
plain file under a plain relative name, and copies each file into every local rank's folder
(``local<i>``, rank_python's TORCHINDUCTOR_CACHE_DIR) where that name does not exist yet: what a rank
compiled itself is never replaced. Folders 0700, files 0600.
"""

from __future__ import annotations

import io
import os
import platform
import re
import sys
import tarfile
from pathlib import Path

from nodeprobe.hashing import sha256_file
from nodeprobe.spec import SpecError, read_spec

SEED = "seed.tar"
SOURCES = "smoke-rank*"  # the smoke run's rank folders (nodeprobe/smoke_launch.py compile_cache)
SKIP = ("tmp", "locks")  # precompiled headers (large, rebuilt when needed) and lock files
NAME = re.compile(r"^[A-Za-z0-9_.+=-]+(/[A-Za-z0-9_.+=-]+)*$")
MAX_BYTES = 4 << 30


class SeedRefused(RuntimeError):
    """The seed is not the master's, or holds what a node may not unpack: nothing was unpacked."""


def fingerprint() -> dict:
    """What a node's ranks need to load another node's compiled kernels: the same torch, Python, machine,
    C library and CPU flags."""
    try:
        from importlib import metadata
        torch = metadata.version("torch")
    except Exception:  # noqa: BLE001 - no torch: nothing can be loaded
        torch = ""
    flags: list[str] = []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = sorted(set(line.partition(":")[2].split()))
                break
    except OSError:
        pass
    return {"torch": torch, "python": "{}.{}".format(*sys.version_info[:2]), "machine": platform.machine(),
            "libc": " ".join(platform.libc_ver()).strip(), "cpu_flags": flags}


def whole_library(path: Path) -> bool:
    """A shared library's section headers lie inside the file: not one a killed compile left half-written
    (torch builds them in place; loading one fails with "file too short")."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
        size = path.stat().st_size
    except OSError:
        return False
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit ELF (what inductor builds here)
        return False
    order = "little" if head[5] == 1 else "big"
    shoff, shentsize, shnum = (int.from_bytes(head[a:b], order) for a, b in ((40, 48), (58, 60), (60, 62)))
    return 0 < shoff + shentsize * shnum <= size


def seed_files(cache: Path) -> dict[str, Path]:
    """The relative name of each plain file of the smoke ranks' folders (the first rank's copy of a name);
    a shared library that is not whole is left out."""
    files: dict[str, Path] = {}
    for folder in sorted(cache.glob(SOURCES)):
        if folder.is_symlink() or not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder).as_posix()
            if rel.split("/")[0] in SKIP or path.is_symlink() or not path.is_file() or not NAME.match(rel):
                continue
            if path.suffix == ".so" and not whole_library(path):
                continue
            files.setdefault(rel, path)
    return files


def pack(spec: dict) -> dict:
    """seed.tar from the smoke ranks' folders, its sha256 and this node's fingerprint (files 0: none)."""
    cache = Path(spec["compile_cache"])
    files = seed_files(cache) if cache.is_dir() else {}
    seed = cache / SEED
    if not files:
        seed.unlink(missing_ok=True)
        return {"files": 0, "fingerprint": fingerprint()}
    tmp = cache / f".{SEED}.tmp"
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, path in files.items():
            data = path.read_bytes()
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    os.replace(tmp, seed)
    return {"files": len(files), "seed": str(seed), "bytes": seed.stat().st_size,
            "sha256": sha256_file(seed, use_cache=False), "fingerprint": fingerprint()}


def members(tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """The tar's members, or SpecError naming the first that is not a plain file under a plain name."""
    out, total = [], 0
    for m in tar.getmembers():
        if m.type not in (tarfile.REGTYPE, tarfile.AREGTYPE):
            raise SeedRefused(f"the compile cache seed holds {m.name!r}, which is not a plain file; nothing "
                              "was unpacked")
        if not NAME.match(m.name) or any(part in (".", "..") for part in m.name.split("/")):
            raise SeedRefused(f"the compile cache seed holds the name {m.name!r}, which is not a plain "
                              "relative name; nothing was unpacked")
        total += m.size
        if total > MAX_BYTES:
            raise SeedRefused(f"the compile cache seed holds more than {MAX_BYTES} bytes; nothing was "
                              "unpacked")
        out.append(m)
    return out


def place(folder: Path, rel: str, data: bytes) -> bool:
    """Write ``data`` as folder/rel unless that name exists (never through a link); True when written."""
    target = folder / rel
    for parent in reversed(target.relative_to(folder).parents[:-1]):
        d = folder / parent
        if d.is_symlink():
            return False
        d.mkdir(mode=0o700, exist_ok=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


def unpack(spec: dict) -> dict:
    """Copy the seed's files into each local rank's folder (``ranks`` of them), when its sha256 is
    ``sha256`` (the control host's)."""
    cache = Path(spec["compile_cache"])
    seed = cache / SEED
    if not seed.is_file() or seed.is_symlink():
        raise SeedRefused(f"{seed} is missing")
    digest = sha256_file(seed, use_cache=False)  # the bytes read now, never a cached stamp
    if digest != spec["sha256"]:
        raise SeedRefused(f"{seed} has sha256 {digest}, not the master's {spec['sha256']}; nothing was "
                          "unpacked")
    os.chmod(cache, 0o700)
    placed = kept = 0
    with tarfile.open(seed, mode="r:") as tar:
        entries = [(m.name, tar.extractfile(m).read()) for m in members(tar)]
    for rank in range(int(spec.get("ranks") or 1)):
        folder = cache / f"local{rank}"
        if folder.is_symlink():
            raise SeedRefused(f"{folder} is a link; nothing was unpacked into it")
        folder.mkdir(mode=0o700, exist_ok=True)
        os.chmod(folder, 0o700)  # rank_python made it with the umask's mode
        for rel, data in entries:
            if place(folder, rel, data):
                placed += 1
            else:
                kept += 1
    return {"files": len(entries), "placed": placed, "kept": kept, "ranks": int(spec.get("ranks") or 1)}


def run(action: str, text: str) -> dict:
    if action == "fingerprint":
        return {"fingerprint": fingerprint()}
    if action == "pack":
        return pack(read_spec(text, ("compile_cache",)))
    if action == "unpack":
        return unpack(read_spec(text, ("compile_cache", "sha256")))
    raise SpecError(f"unknown action {action!r}")
