"""What the tests of one file left on a simulated cluster's hosts, read from this machine (no SSH, no exec).

tests/conftest.py takes such hosts down when the file ends: the next file of the worker that asks for the same
shape would take them as they are (one CI run's ufw test found an earlier file's ufw rules in force)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from simlan.probe import comm
from simlan.system import is_zombie, processes_in_pid_namespace

REAL_UFW = Path("/etc/ufw")
REAL_DEFAULT_UFW = Path("/etc/default/ufw")


def _files(root: Path) -> dict[str, str]:
    """{relative path: sha256} of the files under `root`."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def _ufw(etc: Path, ufw: Path = REAL_UFW, default: Path = REAL_DEFAULT_UFW) -> bool:
    """True when the host's ufw settings are still the copy of this machine's that `simlan up` made."""
    same_default = not default.exists() or (etc / "default-ufw").read_bytes() == default.read_bytes()
    return same_default and _files(etc / "ufw") == _files(ufw)


def _processes(host) -> list[str]:
    """Names of the host's processes besides its PID 1, its child `sleep` and sshd (a listener, or the
    session an SSH ControlPersist master keeps open for a minute)."""
    names = []
    for pid in processes_in_pid_namespace(host.pid1):
        name = comm(pid)
        if pid == host.pid1 or name == "sshd" or is_zombie(pid) or not name:
            continue
        if name == "sleep" and _parent(pid) == host.pid1:
            continue
        names.append(name)
    return sorted(set(names))


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def changes(cluster) -> list[str]:
    """'HOST: WHAT' for each thing on a host that `simlan up` did not make: a lab folder, keys in ~/.ssh,
    ddplab's records, ufw settings, processes, a shaped link."""
    found = []
    for h in cluster.hosts:
        d = Path(h.dir)
        what = [label for label, changed in (
            ("~/ddplab", (d / "home" / "ddplab").exists()),
            ("~/.ssh", any((d / "home" / ".ssh").iterdir())),
            ("/var/lib/ddplab", any((d / "var-lib-ddplab").iterdir())),
            ("ufw settings", not _ufw(d / "etc")),
            ("a link shaped with simlan link", h.link is not None),
        ) if changed]
        what += [f"process {name}" for name in _processes(h)]
        found += [f"{h.name}: {w}" for w in what]
    return found
