"""The root filesystem of a stock host: a Debian 12 (bookworm) or 13 (trixie) minbase system with
openssh-server, sudo, python3, iproute2 and procps and nothing else, built once per release with debootstrap
from the Debian mirror in this machine's apt sources (its bookworm entries: the same mirror serves trixie)
and cached in /var/cache/ddplab-simlan/<release>-minbase.

Every stock host sees it read-only as the lower layer of its own overlay (simlan.stockinit), so the
cache is never written by a host. A stamp file beside the tree (`bookworm-minbase.stamp`, JSON)
marks it complete and records the recipe it was built from; a missing stamp or another recipe means
"build again". The build goes into a temporary folder that is renamed into place at the end, so an
interrupted build never leaves a half cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from simlan.errors import SimlanError
from simlan.state import flock_file
from simlan.system import which

CACHE_DIR = Path(os.environ.get("SIMLAN_ROOTFS_CACHE", "/var/cache/ddplab-simlan"))
SUITE = "bookworm"  # the default release, and the suite whose mirror this machine's apt sources name
RELEASES = {"bookworm": "12", "trixie": "13"}  # the Debian releases a stock host can be: suite -> version
PACKAGES = ("openssh-server", "sudo", "python3", "iproute2", "procps")
RECIPE_VERSION = 1  # bump when the build steps below change: old caches are then rebuilt
BUILD_TIMEOUT = 900
APT_SOURCES = (Path("/etc/apt/sources.list"), Path("/etc/apt/sources.list.d"))


def name(suite: str = SUITE) -> str:
    return f"{suite}-minbase"


def rootfs_dir(suite: str = SUITE) -> Path:
    return CACHE_DIR / name(suite)


def stamp_path(suite: str = SUITE) -> Path:
    return CACHE_DIR / f"{name(suite)}.stamp"


def _entries() -> list[tuple[str, list[str]]]:
    """(URI, suites) of every enabled `deb` entry in this machine's apt sources (one-line and deb822)."""
    found: list[tuple[str, list[str]]] = []
    folder = APT_SOURCES[1]
    files = [APT_SOURCES[0], *sorted(folder.glob("*.list")), *sorted(folder.glob("*.sources"))]
    for f in files:
        try:
            text = f.read_text()
        except OSError:
            continue
        if f.suffix == ".sources":
            for stanza in text.split("\n\n"):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if ":" in line and not line.lstrip().startswith("#"):
                        key, _, value = line.partition(":")
                        fields[key.strip().lower()] = value.strip()
                if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                    for uri in fields.get("uris", "").split():
                        found.append((uri, fields.get("suites", "").split()))
        else:
            for line in text.splitlines():
                words = line.split("#", 1)[0].split()
                if len(words) >= 3 and words[0] == "deb":
                    words = [w for w in words[1:] if not w.startswith("[")]  # drop [options]
                    found.append((words[0], words[1:2]))
    return found


def debian_mirrors() -> tuple[str, str | None]:
    """(main mirror, security mirror or None) for bookworm from this machine's apt sources."""
    entries = _entries()
    main = next((uri for uri, suites in entries if SUITE in suites), None)
    security = next((uri for uri, suites in entries if f"{SUITE}-security" in suites), None)
    if main is None:
        raise SimlanError(f"/etc/apt/sources.list(.d): no `deb` entry for suite {SUITE}; stock hosts are "
                          "built from this machine's Debian mirror; add one (e.g. URIs: "
                          "http://deb.debian.org/debian, Suites: bookworm)", code=2)
    return main.rstrip("/"), security.rstrip("/") if security else None


def release(text: str) -> str:
    """A release named by its suite or version ("trixie", "13") -> its suite."""
    by_version = {v: k for k, v in RELEASES.items()}
    suite = by_version.get(text, text)
    if suite not in RELEASES:
        raise SimlanError(f"--release: unknown Debian release {text!r}; allowed: "
                          f"{', '.join(f'{k} ({v})' for k, v in RELEASES.items())}", code=2)
    return suite


def parse_releases(specs: list[str] | tuple[str, ...], hosts: list[str]) -> dict[str, str]:
    """["node1=trixie"] -> {"node1": "trixie"} (hosts of the default release are left out); a bad spec raises
    SimlanError (exit 2)."""
    out: dict[str, str] = {}
    for spec in specs:
        host, sep, value = spec.partition("=")
        if not sep or host.strip() not in hosts:
            raise SimlanError(f"--release {spec!r}: not HOST=RELEASE with one of the hosts "
                              f"({', '.join(hosts)}); use e.g. --release node1=trixie", code=2)
        suite = release(value.strip())
        if suite != SUITE:
            out[host.strip()] = suite
    return out


def recipe(suite: str = SUITE) -> dict:
    main, security = debian_mirrors()
    return {"version": RECIPE_VERSION, "suite": suite, "variant": "minbase", "packages": list(PACKAGES),
            "mirror": main, "security_mirror": security}


def is_ready(want: dict | None = None, suite: str = SUITE) -> bool:
    """True when the cache is complete (stamp present) and was built from `want` (default: recipe())."""
    try:
        stamp = json.loads(stamp_path(suite).read_text())
    except (OSError, ValueError):
        return False
    return rootfs_dir(suite).is_dir() and stamp.get("recipe") == (want or recipe(suite))


def stamp(suite: str = SUITE) -> dict:
    """The stamp of the cache (recipe, build seconds, size), or {} when there is none."""
    try:
        return json.loads(stamp_path(suite).read_text())
    except (OSError, ValueError):
        return {}


def ensure(log=print, suite: str = SUITE) -> Path:
    """The cached root filesystem of `suite`, built first if missing, incomplete or of another recipe."""
    want = recipe(suite)
    if is_ready(want, suite):
        return rootfs_dir(suite)
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    with _build_lock():
        if not is_ready(want, suite):  # another simlan may have built it while we waited
            _build(want, log)
    return rootfs_dir(suite)


def _build_lock(timeout: float = BUILD_TIMEOUT):
    return flock_file(CACHE_DIR / "build.lock", timeout,
                      f"{CACHE_DIR / 'build.lock'}: another simlan has been building the stock root "
                      f"filesystem for over {timeout:g} s; wait for it", poll=0.5)


def _mounts_under(path: Path) -> list[str]:
    prefix = str(path.resolve()) + "/"
    with open("/proc/self/mountinfo") as fh:
        points = [line.split()[4] for line in fh]
    return sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True)


def _remove_tree(path: Path) -> None:
    """Remove a (half-built) tree; first unmount anything an interrupted debootstrap left mounted in it."""
    if not path.exists():
        return
    for point in _mounts_under(path):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30)
    shutil.rmtree(path, ignore_errors=True)


def _sources_list(want: dict) -> str:
    """Sources as the Debian installer writes them, on this machine's mirror."""
    suite = want["suite"]
    lines = [f"deb {want['mirror']} {suite} main"]
    if want["security_mirror"]:
        lines.append(f"deb {want['security_mirror']} {suite}-security main")
    lines.append(f"deb {want['mirror']} {suite}-updates main")
    return "\n".join(lines) + "\n"


def _build(want: dict, log) -> None:
    debootstrap = which("debootstrap")
    if debootstrap is None:
        raise SimlanError("--stock: missing `debootstrap`; install the Debian package: "
                          "apt-get install -y debootstrap", code=2)
    suite = want["suite"]
    for old in CACHE_DIR.glob(f".{name(suite)}.build-*"):  # an interrupted build of an earlier run
        _remove_tree(old)
    tmp = CACHE_DIR / f".{name(suite)}.build-{os.getpid()}"
    started = time.monotonic()
    log(f"simlan: building the stock Debian {suite} root filesystem in {rootfs_dir(suite)} "
        f"(once; about a minute) from {want['mirror']}")
    try:
        _run([debootstrap, "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(tmp),
              want["mirror"]], "debootstrap", BUILD_TIMEOUT)
        # Sources and package lists as on a fresh install (the installer runs `apt-get update`).
        (tmp / "etc/apt/sources.list").write_text(_sources_list(want))
        shutil.copy2("/etc/resolv.conf", tmp / "etc/resolv.conf")
        _run(["chroot", str(tmp), "apt-get", "-q", "update"], "apt-get update in the new root", 300)
        _run(["chroot", str(tmp), "apt-get", "clean"], "apt-get clean in the new root", 60)
        # Per-host identity is made at each host's first boot (simlan.stockinit): no shared host keys.
        for key in (tmp / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        (tmp / "etc/resolv.conf").unlink()
        (tmp / "etc/hostname").write_text("localhost\n")
        size = int(subprocess.run(["du", "-sb", str(tmp)], capture_output=True, text=True,
                                  timeout=120).stdout.split()[0])
        if rootfs_dir(suite).exists():  # incomplete or of another recipe
            _remove_tree(rootfs_dir(suite))
        tmp.rename(rootfs_dir(suite))
    except BaseException:
        _remove_tree(tmp)
        raise
    seconds = round(time.monotonic() - started, 1)
    data = {"recipe": want, "built_at": time.time(), "build_seconds": seconds, "bytes": size}
    part = stamp_path(suite).with_suffix(".stamp.tmp")
    part.write_text(json.dumps(data, indent=2) + "\n")
    part.replace(stamp_path(suite))  # written last: a stamp means a complete tree
    log(f"simlan: stock root filesystem built in {seconds:g} s ({size / 1e6:.0f} MB)")


def _run(cmd: list[str], what: str, timeout: float) -> None:
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8",
           "DEBIAN_FRONTEND": "noninteractive"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise SimlanError(f"{what}: no result after {timeout:g} s") from exc
    if proc.returncode != 0:
        lines = (proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}").splitlines()
        raise SimlanError(f"{what} failed (exit {proc.returncode}): {' | '.join(lines[-3:])}")
