"""``python -m nodeprobe code-smoke < spec``: run the user's entry point as 2 CPU ranks over loopback gloo.

Before the ranks of a run start, the master runs the user's own entry point (with its arguments and
``ddplab_env``, as the launch would) as 2 local ranks for at most ``seconds``, or until every rank has
made ``steps`` optimizer steps (torch.compile's seconds not counted: the limit judges the code, the
compile warms the caches the run's ranks load, nodeprobe/compile_seed.py). This module runs the passes and
remembers the ones that passed; each concern of a pass reads as a module of its own:

- nodeprobe/smoke_launch.py starts the store and the ranks on loopback only, in a scratch copy of the code,
  every process in one process group, killed at the end, on timeout too;
- nodeprobe/smoke_rank.py is each rank's process: the entry point under watch (nodeprobe/smoke_hooks.py
  wraps torch, nodeprobe/smoke_record.py keeps the rank's report, nodeprobe/smoke_lines.py the lines of the
  user's files that ran);
- nodeprobe/smoke_judge.py gives the verdict: whether the code trains as one DDP run on CPU, or one sharded
  run (nodeprobe/smoke_shards.py checks FSDP2's shards).

Nothing is left in the user's tree: the scratch copy (``scratch``, a folder of ddplab's own in the run
folder) is removed at the end.

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

import hashlib
import json
import os
import signal
import time
from importlib import metadata
from pathlib import Path

from nodeprobe import hashing
from nodeprobe.smoke_judge import judge
from nodeprobe.smoke_launch import (
    WORLD,
    drop_compile_caches,
    layout,
    make_scratch,
    read_json,
    remove_scratch,
    run_ranks,
)
from nodeprobe.spec import SpecError, read_spec  # noqa: F401 (SpecError: callers catch it here)

CACHE_KEEP = 32
# the probe's own source, in the cache key: this module and the smoke_*.py modules of its passes and ranks
SOURCES = sorted([Path(__file__), *Path(__file__).parent.glob("smoke_*.py")])


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
    own = hashlib.sha256(b"".join(path.read_bytes() for path in SOURCES)).hexdigest()
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
