"""``python -m nodeprobe code-tune < spec``: the configured run as N local ranks, timed (``ddplab tune``).

The 1-node layouts of ``python -m ddplab tune`` (1 process, N processes): the entry point (your code, or
the built-in trainer with the arguments the launch gives it) runs as ``world`` ranks on this node, with
the smoke run's launcher, nodeprobe/smoke_launch.py (a scratch copy of the code, removed at its end; the
store on 127.0.0.1 and gloo on ``lo``: nothing listens beyond loopback; every process in one process group,
ended together), without its recording shim, for at most ``seconds``. Rank 0's output is read with
nodeprobe/log_metrics.py (``log_pattern``: ddplab_log_pattern) into records (step, loss, tokens/s, step
time, all-reduce time where printed) and kept as ``log`` in ``out`` (a file of the run folder).

Spec keys: those of code-smoke, plus world, log_pattern, out.
"""

from __future__ import annotations

from pathlib import Path

from nodeprobe import log_metrics, smoke_launch
from nodeprobe.spec import read_spec


def code_tune(spec: dict) -> dict:
    scratch = Path(spec["scratch"])
    smoke_launch.make_scratch(scratch)
    try:
        run = smoke_launch.run_ranks({**spec, "measure": True, "steps": 0}, scratch)
        log = scratch / f"logs-{run['name']}" / "rank0.log"
        text = log.read_text(errors="replace") if log.exists() else ""
    finally:
        smoke_launch.remove_scratch(scratch)
    if spec.get("out"):
        out = Path(spec["out"])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    lines = log_metrics.split_lines(text if text.endswith("\n") else text + "\n")
    try:
        read = {"format": None, "records": []}
        fmt = log_metrics.choose(lines, spec.get("log_pattern") or "")
        if fmt:
            read = {"format": fmt.name, "records": log_metrics.parse(lines, fmt)[0]}
    except log_metrics.PatternError as e:
        return {"probe": "code-tune", "error": f"ddplab_log_pattern {e}"}
    codes = [r.get("returncode") for r in run["ranks"]]
    failed = [c for c in codes if c not in (0, -9, None)]
    last = " | ".join(run["ranks"][codes.index(failed[0])]["log_tail"][-2:]) if failed else ""
    note = (f"a rank exited with code {failed[0]}: {last}" if failed
            else "stopped after the time limit" if run["timed_out"] else "ran to its end")
    return {"probe": "code-tune", "world": int(spec.get("world") or smoke_launch.WORLD), **read,
            "seconds": run["seconds"], "timed_out": run["timed_out"], "note": note}


def run(text: str) -> dict:
    return code_tune(read_spec(text, ("python", "src", "scratch", "entrypoint")))
