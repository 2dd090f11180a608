"""Run ansible-playbook and ddplab from the repository root, with wall-clock limits, and read PLAY RECAP."""

from __future__ import annotations

import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def playbook(name: str, *args: str, inventory: str | os.PathLike | None = None, extra: dict | None = None,
             timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """ansible-playbook playbooks/NAME [-i INVENTORY] -e k=v ...; output kept for the assertion message."""
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{name}"]
    if inventory is not None:
        argv += ["-i", str(inventory)]
    for key, value in (extra or {}).items():
        argv += ["-e", f"{key}={value}"]
    argv += list(args)
    full_env = {**os.environ, "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1", **(env or {})}
    return subprocess.run(argv, cwd=REPO, env=full_env, text=True, capture_output=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def recap(proc: subprocess.CompletedProcess) -> dict[str, dict[str, int]]:
    """{host: {ok, changed, unreachable, failed}} from PLAY RECAP."""
    return {m[0]: dict(zip(("ok", "changed", "unreachable", "failed"), map(int, m[1:]), strict=True))
            for m in RECAP.findall(proc.stdout)}


def task_headers(proc: subprocess.CompletedProcess) -> list[str]:
    """The TASK [...] headers the playbook printed, in order."""
    return re.findall(r"^TASK \[(.*)\] \**$", proc.stdout, re.M)


def empty_plays(proc: subprocess.CompletedProcess) -> list[str]:
    """The plays that matched no host ("skipping: no hosts matched")."""
    return re.findall(r"^PLAY \[(.*)\] \**\nskipping: no hosts matched", proc.stdout, re.M)


def tail(proc: subprocess.CompletedProcess, n: int = 60) -> str:
    return "\n".join((proc.stdout + proc.stderr).splitlines()[-n:])


def make_shards(out: Path) -> Path:
    """A small deterministic shard set (trainer.data prepare), made once per test session."""
    if not (out / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(out), "--docs", "1024"],
                       cwd=REPO, check=True, capture_output=True, timeout=120)
    return out


def ensure_wheelhouse() -> Path:
    """The repository's wheelhouse (what `make wheelhouse` fills: the CPU torch and its dependencies for
    Python 3.11), filled once; test files in parallel workers that need it wait for one another's fill."""
    folder = REPO / "wheelhouse"
    folder.mkdir(exist_ok=True)
    with open(folder / ".fill.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "manifest.json").exists():
            argv = [sys.executable, "-m", "ddplab.wheelhouse", "fill", "--dir", str(folder), "--python",
                    "3.11"]
            subprocess.run(argv, cwd=REPO, check=True, timeout=900)
    return folder
