"""The smoke run's launcher: one pass's ranks started as torchrun would start them, on loopback only
(nodeprobe/code_smoke.py runs its passes with it, nodeprobe/code_tune.py its measurement).

The code runs in a scratch copy (``scratch``, a folder of ddplab's own in the run folder: folders recreated,
files up to LINK_BYTES copied, larger ones symlinked, read-only by convention), removed by the caller at the
end. Each rank gets the run's layout (``layout``), a torch.compile cache folder of its own and the user's
``ddplab_env``, and runs under nodeprobe/smoke_rank.py, which records what it did in a report file this
launcher watches. Nothing listens beyond loopback: the launcher binds the store's socket to 127.0.0.1 and a
store process serves it (torchrun --standalone's store listens on every interface); the ranks dial it
(TORCHELASTIC_USE_AGENT_STORE) and gloo binds to ``lo`` (GLOO_SOCKET_IFNAME). Every process it starts is in
one process group, killed at the end, on timeout too.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from nodeprobe import hashing

WORLD = 2
LINK_BYTES = 1 << 20  # larger files of the code are symlinked into the scratch copy, not copied
MARKER = ".ddplab-smoke"  # in the scratch folder: ddplab made it, so ddplab may remove it
GRACE_S = 3.0  # after one rank failed, how long the other may take to record its own end
POLL_S = 0.2
# torch.compile's seconds do not count against the limit (a cold compile of nanochat d4 takes minutes on a
# small machine), up to this many: a compile that never ends still ends the smoke run
MAX_COMPILE_S = 1200.0
RANK_SCRIPT = Path(__file__).with_name("smoke_rank.py")
# the caller's variables the ranks do not inherit (each rank gets its own)
INHERITED_NOT = ("TMUX", "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")
COMPILE_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"  # torch.compile's caches (FX graph, AOT autograd, .so, Triton)


def entry_argv(entrypoint: str, args: list) -> list[str]:
    entry = entrypoint.strip()
    if entry.startswith("-m"):
        return ["-m", entry[2:].strip(), *map(str, args)]
    return [entry, *map(str, args)]


def copy_tree(src: Path, dest: Path) -> dict:
    """The code as the ranks see it, in dest: the files ddplab placed (every file when there is no
    record), small ones copied, large ones symlinked to the original."""
    copied = linked = 0
    for rel in hashing.tree_files(src):
        source, target = src / rel, dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.stat().st_size > LINK_BYTES:
            target.symlink_to(source.resolve())
            linked += 1
        else:
            shutil.copy2(source, target)
            copied += 1
    return {"copied": copied, "linked": linked}


def make_scratch(scratch: Path) -> None:
    if scratch.exists():
        if not (scratch / MARKER).exists():
            raise RuntimeError(f"{scratch} exists and is not ddplab's smoke folder; move it away")
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    (scratch / MARKER).write_text("made by ddplab's smoke run; removed at its end\n")


def remove_scratch(scratch: Path) -> None:
    if (scratch / MARKER).exists():
        shutil.rmtree(scratch, ignore_errors=True)
    parent = scratch.parent
    with contextlib.suppress(OSError):
        parent.rmdir()  # the run folder, when the smoke run made it and nothing else is in it


def loopback_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    return sock


def layout(spec: dict, rank: int) -> dict:
    """The rank variables torchrun gives smoke rank ``rank``, as in the real run: on a lab of several nodes
    the ranks stand in for the first rank of as many nodes (LOCAL_RANK 0 each, GROUP_RANK their node), so
    code that takes LOCAL_RANK for the global rank fails here as it would across nodes; on one node they
    are its local ranks. Either way the variables agree with each other
    (RANK = GROUP_RANK x LOCAL_WORLD_SIZE + LOCAL_RANK): the smoke group has only ``world`` ranks."""
    world = int(spec.get("world") or WORLD)
    if int(spec.get("nodes") or 1) >= world:
        node, local, per_node, nodes = rank, 0, 1, world
    else:
        node, local, per_node, nodes = 0, rank, world, 1
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(per_node), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes),
            "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
            # ddplab's own names in trainer.env
            "NODE_RANK": str(node), "NNODES": str(nodes), "NPROC_PER_NODE": str(per_node)}


def drop_compile_caches(spec: dict) -> None:
    """Remove the smoke ranks' folders from the lab's compile cache (ddplab made them): ranks killed while
    compiling leave partly written libraries there (torch builds them in place), which the next smoke run
    would load. Kept only after a pass, when the ranks had compiled what they ran."""
    if spec.get("compile_cache"):
        for rank in range(int(spec.get("world") or WORLD)):
            shutil.rmtree(Path(spec["compile_cache"]) / f"smoke-rank{rank}", ignore_errors=True)


def compile_cache(spec: dict, scratch: Path, rank: int) -> Path:
    """The rank's own torch.compile cache folder (TORCHINDUCTOR_CACHE_DIR), with its TMPDIR (``tmp``: torch
    keeps precompiled headers in TMPDIR/torchinductor_<user> whatever TORCHINDUCTOR_CACHE_DIR says). Ranks
    sharing one would load each other's half-written compiled libraries. Under the lab's compile cache
    (``compile_cache``, kept for the next smoke run), else in the scratch folder; never torch's default
    /tmp/torchinductor_<user>, a name any local user can create first (and fill)."""
    base = Path(spec["compile_cache"]) if spec.get("compile_cache") else scratch / "compile-cache"
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    (base / f"smoke-rank{rank}" / "tmp").mkdir(parents=True, exist_ok=True)
    return base / f"smoke-rank{rank}"


def rank_env(spec: dict, rank: int, port: int, scratch: Path) -> dict:
    code, run_dir = scratch / "code", scratch / "run"
    env = {k: v for k, v in os.environ.items() if k not in INHERITED_NOT}
    threads = str(int(spec.get("threads") or 1))
    env.update({str(k): str(v) for k, v in (spec.get("lab_env") or {}).items()})
    cache = compile_cache(spec, scratch, rank)
    env.update({COMPILE_CACHE_VAR: str(cache), "TMPDIR": str(cache / "tmp")})  # ddplab_env's values win
    env.update({str(k): str(v) for k, v in (spec.get("user_env") or {}).items()})
    env.update(layout(spec, rank))
    env.update({
        "ROLE_NAME": "default", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "ddplab-smoke",
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": str(code),
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "DDPLAB_RUN_DIR": str(run_dir),
        "DDPLAB_SMOKE": "1", "DDPLAB_SMOKE_CODE": str(code),
    })
    return env


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def join_group(pgid: int):
    """A child's first acts: join a process group (0: a new one, the store's, that the ranks join), so one
    killpg ends every process the smoke run started (their session stays the caller's: setpgid allows no
    other); and ask the kernel to kill it when this launcher dies (killed itself, or its SSH session gone)
    before it could end them."""
    def setup():
        os.setpgid(0, pgid)
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    return setup


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def tail(path: Path, lines: int = 12) -> list[str]:
    try:
        return path.read_text(errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return []


def compile_seconds(recs: list[dict], now: float) -> float:
    """The seconds the slowest rank spent compiling so far (the others wait for it at their next collective),
    up to MAX_COMPILE_S."""
    spent = [rec.get("compile_s", 0.0) + (now - rec["compiling_since"] if "compiling_since" in rec else 0.0)
             for rec in recs]
    return min(max(spent, default=0.0), MAX_COMPILE_S)


def rank_argv(spec: dict, report: Path, steps: int) -> list[str]:
    """A rank's command: the entry point under the recording shim, or (``measure``: ddplab tune) as it is."""
    entry = entry_argv(spec["entrypoint"], spec.get("args") or [])
    if spec.get("measure"):
        return [spec["python"], *entry]
    return [spec["python"], str(RANK_SCRIPT), "rank", str(report), str(steps), "--", *entry]


def run_ranks(spec: dict, scratch: Path, name: str = "run") -> dict:
    """Start the store and the ranks (``world``, default 2), watch their reports, end them all; what each
    rank recorded. ``spec["args"]`` are the entry point's; ``steps`` 0 lets the ranks run to their end.
    The scratch copy of the code is made by the first pass; a later one (``name``) runs in it as left."""
    code, run_dir, reports, logs = (scratch / d for d in ("code", "run", f"report-{name}", f"logs-{name}"))
    copied = None if code.exists() else copy_tree(Path(spec["src"]), code)
    for d in (code, run_dir, reports, logs):
        d.mkdir(exist_ok=True)
    cwd = code if spec.get("workdir", "code") == "code" else run_dir
    steps = int(spec["steps"]) if spec.get("steps") is not None else 2
    python, seconds = spec["python"], float(spec.get("seconds") or 90)
    world = int(spec.get("world") or WORLD)
    sock = loopback_socket()
    port = sock.getsockname()[1]
    procs: list[subprocess.Popen] = []
    start = time.monotonic()
    timed_out = False
    compiled = 0.0
    try:
        with open(logs / "store.log", "wb") as log:
            store = subprocess.Popen([python, str(RANK_SCRIPT), "store", str(sock.fileno())],
                                     pass_fds=(sock.fileno(),), stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT, preexec_fn=join_group(0), cwd=scratch)
        procs.append(store)
        sock.close()  # the store holds it now
        for rank in range(world):
            with open(logs / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    rank_argv(spec, reports / f"rank{rank}.json", steps),
                    env=rank_env(spec, rank, port, scratch), cwd=cwd, stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, preexec_fn=join_group(store.pid)))
        ranks = procs[1:]
        failed_at = None
        while True:
            time.sleep(POLL_S)
            recs = [read_json(reports / f"rank{r}.json") or {} for r in range(world)]
            if all(rec.get("done") for rec in recs) or all(p.poll() is not None for p in ranks):
                break
            if failed_at is None and any(p.poll() not in (None, 0) for p in ranks):
                failed_at = time.monotonic()
            if failed_at is not None and time.monotonic() - failed_at > GRACE_S:
                break
            compiled = compile_seconds(recs, time.time())
            if store.poll() is not None or time.monotonic() - start - compiled > seconds:
                timed_out = store.poll() is None
                break
    finally:
        if procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(procs[0].pid, signal.SIGKILL)
        for p in procs:
            p.wait()
        sock.close()
    out = []
    for r, p in enumerate(procs[1:]):
        rec = read_json(reports / f"rank{r}.json") or {"rank": r, "steps": [], "calls": {}, "ddp": 0}
        rec["returncode"] = p.returncode
        rec["log_tail"] = tail(logs / f"rank{r}.log")
        out.append(rec)
    return {"ranks": out, "timed_out": timed_out, "seconds": round(time.monotonic() - start, 1),
            "steps_wanted": steps, "limit_s": seconds, "files": copied, "compile_s": round(compiled, 1),
            "name": name, "args": list(map(str, spec.get("args") or [])),
            "store_log": tail(logs / "store.log", 5) if procs[0].returncode not in (None, -9) else []}
