"""``python -m nodeprobe code-smoke < spec``: run the user's entry point as 2 CPU ranks over loopback gloo.

Before the ranks of a run start, the master runs the user's own entry point (with its arguments and
``ddplab_env``, as the launch would) as 2 local ranks for at most ``seconds``, or until every rank has
made ``steps`` optimizer steps (torch.compile's seconds not counted: the limit judges the code, the
compile warms the caches the run's ranks load, nodeprobe/compile_seed.py), under nodeprobe/smoke_rank.py,
which records what each rank did. The verdict (``judge``) says whether the code trains as one DDP run on
CPU, or one sharded run (FSDP2): it refuses a crash (the user's file:line), no process group, a group that
is not gloo of world size 2, no collective before the first optimizer step (each rank trains alone),
parameters that differ across the ranks after a step (FSDP2's shards: a layout the ranks do not share,
shards that do not cover each parameter once), and an exit without any optimizer step.

Nothing is left in the user's tree: the code runs in a scratch copy (``scratch``, a folder of ddplab's own
in the run folder: folders recreated, files up to LINK_BYTES copied, larger ones symlinked, read-only by
convention), removed at the end. Nothing listens beyond loopback: the launcher binds the store's socket
to 127.0.0.1 and a store process serves it (torchrun --standalone's store listens on every interface);
the ranks dial it (TORCHELASTIC_USE_AGENT_STORE) and gloo binds to ``lo`` (GLOO_SOCKET_IFNAME). Every
process it starts is in one process group, killed at the end, on timeout too.

With ``whole`` (ddplab_smoke_whole) or ``whole_args`` (ddplab_smoke_args, default ``args``) the ranks run
the entry point with those arguments to its end
(each rank must exit 0; no stop after ``steps``), and when a rank saved a file with torch.save (a
checkpoint), a second pass in the same scratch copy runs it with ``resume_args`` (default: the same
arguments again, for code that resumes when it finds its checkpoint), which must exit 0 too. Each pass
has ``seconds``. The result says which lines of the user's files ran (``ran``, over both passes and
ranks), the checkpoints and the hosts the code looked up.

A pass is remembered in ``cache`` (the lab folder) under a key of the code hash, entry point, arguments,
``ddplab_env``, the torch version and this probe's own source: a relaunch of unchanged code skips it.
The ranks see the run's layout (``layout``: ``nodes``, the run's node count) and compile into folders
of their own (``compile_cache``), kept after a pass.

Spec keys: python, src, scratch, entrypoint, args, user_env, lab_env, workdir, seconds, steps, threads,
cache, code_hash_file, nodes, compile_cache, whole, whole_args, resume_args.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from importlib import metadata
from pathlib import Path

from nodeprobe import hashing
from nodeprobe.spec import SpecError, read_spec  # noqa: F401 (SpecError: callers catch it here)

WORLD = 2
LINK_BYTES = 1 << 20  # larger files of the code are symlinked into the scratch copy, not copied
MARKER = ".ddplab-smoke"  # in the scratch folder: ddplab made it, so ddplab may remove it
GRACE_S = 3.0  # after one rank failed, how long the other may take to record its own end
POLL_S = 0.2
# torch.compile's seconds do not count against the limit (a cold compile of nanochat d4 takes minutes on a
# small machine), up to this many: a compile that never ends still ends the smoke run
MAX_COMPILE_S = 1200.0
CACHE_KEEP = 32
RANK_SCRIPT = Path(__file__).with_name("smoke_rank.py")
MISSING_MODULE = re.compile(r"No module named '([^']+)'")
# exception types (or their causes) of a download that found no route, and the words of one in a message
NETWORK_ERRORS = {"URLError", "gaierror", "ConnectionError", "ConnectTimeout", "ConnectError",
                  "NewConnectionError", "NameResolutionError", "MaxRetryError", "ConnectTimeoutError",
                  "LocalEntryNotFoundError", "OfflineModeIsEnabled", "ConnectionRefusedError",
                  "ConnectionResetError", "TimeoutError", "timeout"}
NETWORK_WORDS = re.compile(r"name resolution|Name or service not known|Network is unreachable|No route to "
                           r"host|nodename nor servname|getaddrinfo failed|couldn't connect to|Failed to "
                           r"resolve|Connection refused", re.I)
# import names whose package on PyPI is named otherwise (the fix for a missing module names the package)
PIP_NAMES = {"yaml": "PyYAML", "cv2": "opencv-python", "sklearn": "scikit-learn", "PIL": "Pillow",
             "skimage": "scikit-image", "bs4": "beautifulsoup4", "dateutil": "python-dateutil",
             "dotenv": "python-dotenv", "attr": "attrs", "jwt": "PyJWT", "git": "GitPython",
             "fitz": "PyMuPDF", "Crypto": "pycryptodome"}
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


def problem(kind: str, what: str, fix: str, rank: int | None = None, where: dict | None = None) -> dict:
    return {"kind": kind, "rank": rank, "what": what, "fix": fix,
            "where": f"{where['file']}:{where['line']}" if where else None}


def grouped(rank: dict) -> bool:
    """The rank made a gloo process group of the smoke run's world size."""
    init = rank.get("init") or {}
    return init.get("backend") == "gloo" and init.get("world") == WORLD


def compiling(run: dict) -> str:
    return f" (besides {run['compile_s']:g} s of torch.compile)" if run.get("compile_s") else ""


def download(rank: dict) -> dict | None:
    """The look-up a rank's error came from, when the error is a download that found no route: the last
    host the rank looked up before it (with the user's line), else the host named in the message."""
    err = rank["error"]
    typed = bool(NETWORK_ERRORS & set(err.get("causes") or [err["type"]]))
    worded = bool(NETWORK_WORDS.search(err["message"]))
    fetches = [f for f in rank.get("fetches") or [] if f.get("t", 0) <= err.get("t", float("inf"))]
    if not ((fetches and (typed or worded)) or (typed and worded)):
        return None
    if fetches:
        return fetches[-1]
    named = re.search(r"(?:https?://|host=')([A-Za-z0-9.-]+)", err["message"])
    return {"host": named.group(1) if named else "a host on the network", "where": None}


def no_route(rank: dict, fetch: dict) -> dict:
    err = rank["error"]
    return problem(
        "download", f"rank {rank['rank']} could not download from {fetch['host']} "
        f"({err['type']}: {err['message'][:200]})", f"the nodes may have no route to {fetch['host']} (this "
        "one had none): fetch it once on the control host and ship it with the code, in ddplab_code_include "
        "(files inside ddplab_code_dir that git ignores: data shards, a tokenizer) or ddplab_sync_dirs (a "
        "folder outside it), and have the code read that copy (for the Hugging Face hub: HF_HOME pointing "
        "at it and HF_HUB_OFFLINE=1 in ddplab_env)", rank["rank"], fetch.get("where") or err.get("where")) \
        | {"host": fetch["host"]}


def judge(run: dict, whole: bool = False, resume: bool = False) -> dict:
    """The verdict on what the ranks recorded: pass, fail (problems, the first is the cause) or
    inconclusive (the time ran out before a rank made an optimizer step, or with ``whole`` before the ranks
    ended). ``resume``: the second pass of a whole run, which may end without a step of its own."""
    ranks, wanted = run["ranks"], run["steps_wanted"]
    errors = sorted((r for r in ranks if r.get("error")), key=lambda r: r["error"].get("t", 0))
    if errors:
        first = errors[0]
        err = first["error"]
        fetch = download(first)
        if fetch:
            return {"verdict": "fail", "problems": [no_route(first, fetch)]}
        missing = MISSING_MODULE.search(err["message"]) if err["type"] == "ModuleNotFoundError" else None
        if missing:
            top = missing.group(1).split(".")[0]
            return {"verdict": "fail", "problems": [problem(
                "missing-module", f"rank {first['rank']} raised {err['type']}: {err['message']}",
                f"install the package that provides {top} ({PIP_NAMES.get(top, top)} on PyPI) on the nodes: "
                "list it in ddplab_pip_requirements (a requirements file in ddplab_code_dir) and run "
                "playbooks/prepare.yml again", first["rank"], err.get("where")) | {"module": top}]}
        if err["type"] == "RankLayoutError":
            return {"verdict": "fail", "problems": [problem(
                "rank-layout", f"rank {first['rank']}: {err['message']}", 'pass '
                'rank=int(os.environ["RANK"]) and world_size=int(os.environ["WORLD_SIZE"]), or leave both '
                "out (init_process_group reads them from torchrun's environment); keep LOCAL_RANK for "
                "choosing a device",
                first["rank"], err.get("where"))]}
        fix = ('create the process group on CPU too (init_process_group(backend="gloo")) before this call'
               if first.get("init") is None and "process group" in err["message"]
               else "make the code run on CPU under gloo at that place")
        return {"verdict": "fail", "problems": [problem(
            "crash", f"rank {first['rank']} raised {err['type']}: {err['message']}".rstrip(": "),
            fix, first["rank"], err.get("where"))]}
    killed = [r for r in ranks if r.get("returncode") not in (0, None, -9) and r.get("exit") is None]
    if killed:
        r = killed[0]
        return {"verdict": "fail", "problems": [problem(
            "crash", f"rank {r['rank']} ended with code {r['returncode']} without a Python exception"
            f" (last output: {' | '.join(r.get('log_tail', [])[-3:]) or 'none'})",
            "run the entry point by hand on the node to see why", r["rank"])]}
    problems = []
    stepped = [r for r in ranks if r.get("steps")]
    if not stepped:
        if run["timed_out"]:
            return {"verdict": "inconclusive", "problems": [], "note": (
                f"no rank made an optimizer step within {run['limit_s']:g} s{compiling(run)}; nothing was "
                "judged "
                "(raise ddplab_smoke_seconds to let it reach one)")}
        if resume:
            return {"verdict": "pass", "problems": [], "note": "the resumed ranks exited 0 without a step"}
        if all(grouped(r) and max(r.get("ops") or 0, sum((r.get("calls") or {}).values())) for r in ranks):
            return {"verdict": "pass", "problems": [], "note": (
                "the ranks exited 0 after collectives on a gloo group of 2 but made no torch.optim step: "
                "their parameters were not compared")}
        exited = next((r for r in ranks if r.get("exit_where")), None)  # sys.exit(0): its line
        return {"verdict": "fail", "problems": [problem(
            "no-training", "the ranks exited 0" + (" (sys.exit)" if exited else "") + " without an optimizer "
            "step (no torch.optim.Optimizer.step ran) and without training together", "check the arguments: "
            "on CPU the entry point must train (a device flag such as --device-type=cpu or --device=cpu, a "
            "step count > 0)", exited["rank"] if exited else None, exited["exit_where"] if exited else None)]}
    for r in ranks:
        init = r.get("init")
        if init is None:
            problems.append(problem(
                "no-group", f"rank {r['rank']} trained without torch.distributed.init_process_group: "
                "each rank trains alone", 'call init_process_group(backend="gloo") on CPU whenever '
                "RANK/WORLD_SIZE are set (torchrun sets them)", r["rank"]))
        elif init["backend"] != "gloo" or init["world"] != WORLD:
            problems.append(problem(
                "bad-group", f"rank {r['rank']}'s process group is {init['backend']} of world size "
                f"{init['world']} (expected gloo of {WORLD})", 'pass backend="gloo" on CPU and let '
                "init_process_group read the world size from the environment", r["rank"]))
    if not problems:
        for r in stepped:
            first = r["steps"][0]
            if max(first.get("ops", 0), first.get("calls", 0)) == 0:
                problems.append(problem(
                    "no-collectives", f"rank {r['rank']} made its first optimizer step without any "
                    "collective (no DDP all-reduce, no torch.distributed call): each rank trains alone",
                    "wrap the model in DistributedDataParallel on CPU too (device_ids=None), or all-reduce "
                    "the gradients before optimizer.step()", r["rank"]))
                break
    if not problems and len(stepped) == WORLD:
        problems += disagreements(stepped)
    if problems:
        return {"verdict": "fail", "problems": problems}
    if whole and run["timed_out"]:
        return {"verdict": "inconclusive", "problems": [], "note": (
            f"the ranks trained but did not reach the end of the run within {run['limit_s']:g} s"
            f"{compiling(run)} (raise "
            "ddplab_smoke_seconds or shorten ddplab_smoke_args)")}
    short = len(stepped) < WORLD or min(len(r["steps"]) for r in stepped) < wanted
    if short and run["timed_out"]:
        return {"verdict": "inconclusive", "problems": [], "note": (
            f"not every rank made {wanted} optimizer steps within {run['limit_s']:g} s{compiling(run)}")}
    return {"verdict": "pass", "problems": []}


def disagreements(stepped: list[dict]) -> list[dict]:
    """The first optimizer step after which the ranks do not hold one model: parameters every rank holds
    whole that differ, or parameters sharded by FSDP2 whose layouts differ or whose shards do not cover
    each parameter exactly once over the ranks (each rank holding all of it trains alone)."""
    for k in range(min(len(r["steps"]) for r in stepped)):
        steps = [r["steps"][k] for r in stepped]
        shards = [s.get("shards") for s in steps]
        optimizer = steps[0]["optimizer"]
        if len({s["sha256"] for s in steps}) > 1:
            sharded = any(shards)
            return [problem(
                "disagree", f"the ranks' {'unsharded ' if sharded else ''}parameters differ after optimizer "
                f"step {k + 1} ({optimizer})", "apply fully_shard to the root module too (after its blocks): "
                "a parameter outside every fully_shard unit is neither sharded nor averaged" if sharded else
                "start from the same weights (DDP broadcasts rank 0's) and average the gradients of every "
                "parameter before the step (DDP does; a manual all-reduce must cover all of them)")]
        if not any(shards):
            continue
        held = ", ".join(f"rank {r['rank']} {(s or {}).get('local_numel', 0):,}" for r, s in zip(
            stepped, shards, strict=True))
        total = max((s or {}).get("global_numel", 0) for s in shards)
        if not all(shards) or len({s["layout"] for s in shards}) > 1:
            return [problem(
                "shard-layout", f"after optimizer step {k + 1} ({optimizer}) the ranks shard different "
                f"parameters or shapes (values held: {held})", "build the same model on every rank and "
                "apply fully_shard to the same modules, over one device mesh of all the ranks")]
        if sum(s["local_numel"] for s in shards) != total:
            return [problem(
                "shard-cover", f"after optimizer step {k + 1} ({optimizer}) the ranks' shards hold "
                f"{sum(s['local_numel'] for s in shards):,} values of a model of {total:,} (values held: "
                f"{held}; device mesh of {shards[0]['mesh_size']}): each rank trains alone",
                "shard over a device mesh of all the ranks (fully_shard's default mesh, or "
                'init_device_mesh("cpu", (world_size,)))')]
    return []


def torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def cache_key(spec: dict) -> str:
    code_hash = ""
    if spec.get("code_hash_file"):
        try:
            code_hash = Path(spec["code_hash_file"]).read_text().strip()
        except OSError:
            code_hash = ""
    if not code_hash:
        code_hash = hashing.lines_digest(hashing.tree_lines(spec["src"]))
    own = hashlib.sha256(Path(__file__).read_bytes() + RANK_SCRIPT.read_bytes()).hexdigest()
    parts = {"code": code_hash, "entrypoint": spec["entrypoint"],
             "args": list(map(str, spec.get("args") or [])),
             "env": {str(k): str(v) for k, v in (spec.get("user_env") or {}).items()},
             "workdir": spec.get("workdir", "code"), "torch": torch_version(), "python": spec["python"],
             "steps": int(spec.get("steps") or 2), "probe": own,
             "whole": whole_run(spec), "whole_args": list(map(str, spec.get("whole_args") or [])),
             "resume": list(map(str, spec.get("resume_args") or [])),
             "layout": [layout(spec, r) for r in range(int(spec.get("world") or WORLD))]}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cached(path: str, key: str) -> bool:
    record = read_json(Path(path)) if path else None
    return bool(record) and key in (record.get("passed") or {})


def remember(path: str, key: str) -> None:
    record = read_json(Path(path)) or {}
    passed = dict(record.get("passed") or {})
    passed[key] = time.time()
    keep = dict(sorted(passed.items(), key=lambda kv: kv[1])[-CACHE_KEEP:])
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({"passed": keep}, indent=1) + "\n")
    os.replace(tmp, path)


def ranges(lines) -> str:
    """Sorted line numbers as "1-5,7,9-12"."""
    out: list[list[int]] = []
    for n in sorted(set(lines)):
        if out and n == out[-1][1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(f"{a}-{b}" if b > a else f"{a}" for a, b in out)


def ran_lines(runs: list[dict]) -> dict[str, str]:
    """The lines of each user file that ran on any rank of any pass."""
    by_file: dict[str, set[int]] = {}
    for run in runs:
        for rank in run["ranks"]:
            for rel, lines in (rank.get("lines") or {}).items():
                by_file.setdefault(rel, set()).update(lines)
    return {rel: ranges(lines) for rel, lines in sorted(by_file.items())}


def checkpoints(run: dict, code: Path) -> list[str]:
    """The files the ranks saved with torch.save that are still there (relative to the code copy when
    inside it)."""
    out = []
    for rank in run["ranks"]:
        for saved in rank.get("saved") or []:
            path = Path(saved["path"])
            if path.is_file():
                rel = os.path.relpath(path, code) if path.is_relative_to(code) else str(path)
                out += [rel] if rel not in out else []
    return out


def ranks_summary(run: dict) -> list[dict]:
    return [{k: r.get(k) for k in ("rank", "init", "ddp", "calls", "ops", "returncode", "exit", "done")}
            | {"steps": len(r.get("steps") or []), "shards": (r.get("steps") or [{}])[-1].get("shards"),
               "ops_before_first_step": (r.get("steps") or [{}])[0].get("ops"),
               "error": {k: v for k, v in (r.get("error") or {}).items() if k != "traceback"} or None,
               "traceback": (r.get("error") or {}).get("traceback"), "log_tail": r.get("log_tail")}
            for r in run["ranks"]]


def whole_run(spec: dict) -> bool:
    return bool(spec.get("whole") or spec.get("whole_args"))


def passes(spec: dict, scratch: Path) -> list[tuple[dict, dict]]:
    """(run, verdict) of each pass: the entry point stopped after ``steps``; or, with ``whole_args``, the
    whole short run, then the pass that resumes from the checkpoint it saved."""
    if not whole_run(spec):
        run = run_ranks(spec, scratch)
        return [(run, judge(run))]
    whole = spec.get("whole_args") or spec.get("args") or []
    first = run_ranks({**spec, "args": whole, "steps": 0}, scratch)
    done = [(first, judge(first, whole=True))]
    saved = checkpoints(first, scratch / "code")
    if done[0][1]["verdict"] == "pass" and saved:
        again = run_ranks({**spec, "args": spec.get("resume_args") or whole, "steps": 0}, scratch, "resume")
        again["resumed_from"] = saved
        done.append((again, judge(again, whole=True, resume=True)))
    return done


def code_smoke(spec: dict) -> dict:
    key = cache_key(spec)
    if spec.get("cache") and cached(spec["cache"], key):
        return {"probe": "code-smoke", "verdict": "cached", "problems": [], "seconds": 0, "key": key}
    scratch = Path(spec["scratch"])
    make_scratch(scratch)
    try:
        done = passes(spec, scratch)
        saved = [checkpoints(run, scratch / "code") for run, _ in done]
    finally:
        remove_scratch(scratch)
    run, verdict = next(((r, v) for r, v in done if v["verdict"] != "pass"), done[-1])
    if verdict["verdict"] == "pass" and spec.get("cache"):
        remember(spec["cache"], key)
    if verdict["verdict"] != "pass":
        drop_compile_caches(spec)
    for problem_ in verdict["problems"]:
        problem_["pass"] = run["name"]
    fetches = [f | {"rank": r["rank"]} for past, _ in done for r in past["ranks"]
               for f in r.get("fetches") or []]
    return {"probe": "code-smoke", **verdict, "seconds": round(sum(r["seconds"] for r, _ in done), 1),
            "timed_out": run["timed_out"], "compile_s": round(sum(r.get("compile_s", 0) for r, _ in done), 1),
            "limit_s": run["limit_s"], "steps_wanted": run["steps_wanted"],
            "files": done[0][0]["files"], "ranks": ranks_summary(run), "key": key,
            "whole": whole_run(spec),
            "passes": [{"name": r["name"], "args": r["args"], "verdict": v["verdict"],
                        "seconds": r["seconds"], "checkpoints": c}
                       for (r, v), c in zip(done, saved, strict=True)],
            "ran": ran_lines([r for r, _ in done]), "fetches": fetches}


def stop_on_signal(signum, _frame):
    raise SystemExit(128 + signum)  # the finally blocks end the ranks and remove the scratch copy


def run(text: str) -> dict:
    spec = read_spec(text, ("python", "src", "scratch", "entrypoint"))
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop_on_signal)
    return code_smoke(spec)
