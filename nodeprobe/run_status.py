"""``python -m nodeprobe run-status --run-dir D --socket S --session =RUN``: read-only state of one
ddplab run on this node, as one JSON object (for roles/launch status and wait).

state is one of: not-started (no run folder), running, exited (with code), lost (no exit code and no live
tmux pane: the rank was killed with its session), stopped (stop.yml marked the run and the rank did not
finish with code 0). Also: code_time (mtime of exit_code), log_time (of launch.log), metrics_time (of the
newest metrics line's file), now (this node's clock, to compare), last_lines (the log's last lines),
error (the last `ddplab: error:` line), lost_peer (that line says this rank lost a peer: it is a
victim, not the cause) and exception (the exception the rank's code raised, with its file:line;
nodeprobe/rank_error.py), read when the rank did not exit 0.
speed: {rank: {compute_ms_per_seq, share, steps}} over each rank's newest metrics records (the straggler
rule's input, judged by ddplab/status.py).
Progress: step, loss and tokens_per_sec from the built-in trainer's newest metrics line, with total (the
steps it was given: its out/config.json, else --total-steps); without metrics files (your own code) from
the lines the code printed into launch.log (nodeprobe/log_metrics.py: the log's first and last 64 KiB;
--log-pattern is ddplab_log_pattern), which also give total and eta_s when the code prints them;
log_format says which lines were read. progress is the one line of text status and wait show
(`step 12/50 loss 2.3456 1234 tok/s eta 0m41s`; a total or an eta that is not known is left out).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import time

from nodeprobe import log_metrics
from nodeprobe.rank_error import log_exception


def mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return None


def tail_lines(path, n):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            return [ln[-300:] for ln in f.read().decode(errors="replace").splitlines() if ln.strip()][-n:]
    except OSError:
        return []


def last_line(path, want_json=False):
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        if not want_json:
            return line
        try:
            return json.loads(line)
        except ValueError:
            continue
    return None


def wait_for_end(run_dir: str, seconds: float, interval: float = 0.2) -> None:
    """Return when the rank wrote its exit code, or after ``seconds``: one poll of roles/launch's wait is
    one round trip that returns as soon as the run is over."""
    deadline = time.monotonic() + seconds
    marker = os.path.join(run_dir, "exit_code")
    while time.monotonic() < deadline and not os.path.exists(marker):
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def progress_text(res: dict) -> str:
    """`step 12/50 loss 2.3456 1234 tok/s eta 0m41s`: what is known of where the rank is."""
    step = fmt(res.get("step"), "") + (f"/{res['total']}" if res.get("step") is not None and res.get("total")
                                       else "")
    eta = res.get("eta_s")
    return (f"step {step} loss {fmt(res.get('loss'), '.4f')} {fmt(res.get('tokens_per_sec'), '.0f')} tok/s"
            + (f" eta {log_metrics.fmt_duration(eta)}" if eta is not None else ""))


def log_progress(log: str, pattern: str) -> dict:
    """What the user's code printed: step, total, loss, tokens_per_sec, eta_s, log_format."""
    try:
        read = log_metrics.read_log(log, pattern)
    except log_metrics.PatternError as e:  # validate refuses it first; this is a hand-made call
        return {"log_format": None, "log_pattern_error": f"ddplab_log_pattern {e}"}
    return {**log_metrics.progress(read["records"], read["context"]), "log_format": read["format"]}


# Slurm job states (squeue %T) in which the job's ranks are alive, or not started yet.
SLURM_ALIVE = ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED")
SLURM_WAITING = ("PENDING", "REQUEUED", "RESV_DEL_HOLD", "REQUEUE_HOLD", "REQUEUE_FED")


def alive_state(pane: dict | None, job_state: str) -> str:
    """The state of a rank with no exit code: from its tmux pane, or (a Slurm run) from its job's state."""
    if job_state:
        if job_state in SLURM_WAITING:
            return "queued"
        return "running" if job_state in SLURM_ALIVE else "lost"
    return "running" if pane and not pane["dead"] else "lost"


def run_status(run_dir: str, socket: str, session: str, wait: float = 0, log_pattern: str = "",
               total_steps: int = 0, job_state: str = "") -> dict:
    if wait > 0:
        wait_for_end(run_dir, wait)
    res = {"state": "not-started", "code": None, "step": None, "loss": None, "tokens_per_sec": None,
           "total": total_steps or None, "eta_s": None, "log_format": None,
           "last_line": "", "pane": None, "code_time": None, "log_time": None, "metrics_time": None,
           "now": time.time(), "last_lines": [], "error": None, "lost_peer": False, "exception": None}
    res["progress"] = progress_text(res)
    if not os.path.isdir(run_dir):
        return res
    out = subprocess.run(
        ["tmux", "-S", socket, "list-panes", "-t", session, "-F", "#{pane_dead} #{pane_pid}"],
        capture_output=True, text=True, check=False,
    )
    if out.returncode == 0 and out.stdout.strip():
        dead, pid = out.stdout.split()[:2]
        res["pane"] = {"dead": dead == "1", "pid": int(pid)}
    try:
        with open(os.path.join(run_dir, "exit_code")) as f:
            res["code"] = int(f.read().strip())
        res["state"] = "exited"
    except (OSError, ValueError):
        res["state"] = alive_state(res["pane"], job_state)
    if job_state:
        res["job_state"] = job_state
    # stop.yml marks the run before it ends it: a rank it ended did not fail (one that finished did finish)
    stopped = mtime(os.path.join(run_dir, "stopped"))
    if stopped is not None and res["state"] != "running" and res["code"] != 0:
        res["state"], res["stopped_time"] = "stopped", stopped
    for path in sorted(glob.glob(os.path.join(run_dir, "out", "metrics.rank*.jsonl"))):
        rec = last_line(path, want_json=True)
        if rec and (res["step"] is None or rec.get("step", -1) >= res["step"]):
            res.update(step=rec.get("step"), loss=rec.get("loss"), tokens_per_sec=rec.get("tokens_per_sec"))
        res["metrics_time"] = max(filter(None, [res["metrics_time"], mtime(path)]), default=None)
        res.setdefault("speed", {})[rank_of(path)] = recent_speed(path)
    if res["metrics_time"] is not None:  # the built-in trainer: its own record of the steps it was given
        res["total"] = run_steps(os.path.join(run_dir, "out", "config.json")) or res["total"]
    log = os.path.join(run_dir, "launch.log")
    if res["metrics_time"] is None:  # no ddplab metrics: your own code's printed lines
        res.update({k: v for k, v in log_progress(log, log_pattern).items() if v is not None})
    res["progress"] = progress_text(res)
    res["last_line"] = (last_line(log) or "")[-300:]
    res["code_time"], res["log_time"] = mtime(os.path.join(run_dir, "exit_code")), mtime(log)
    res["last_lines"] = tail_lines(log, 6)
    lines = tail_lines(log, 400)
    starts = [i for i, ln in enumerate(lines) if ln.startswith("ddplab: run ")]  # launch.sh's first line
    errors = [ln for ln in lines[starts[-1] if starts else 0:] if "ddplab: error:" in ln]
    if errors:
        res["error"] = errors[-1][errors[-1].index("ddplab: error:"):]
        res["lost_peer"] = "lost peer" in res["error"] or "lost a peer" in res["error"] or \
            "lost contact with the other ranks" in res["error"]
    if res["state"] in ("exited", "lost") and res["code"] != 0:
        res["exception"] = log_exception(log)
    res["membership"] = membership(os.path.join(run_dir, "out", "membership.jsonl"))
    return res


def rank_of(metrics_path: str) -> str:
    """metrics.rank3.jsonl -> "3" (a JSON key)."""
    return os.path.basename(metrics_path)[len("metrics.rank"):-len(".jsonl")]


def recent_speed(path: str) -> dict:
    """The rank's median compute ms per sequence over its newest steps, and its last share (the figures the
    control host's straggler rule compares: trainer/straggler_rule.py)."""
    from trainer.straggler_rule import WINDOW, per_sequence

    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 65536))
            lines = f.read().decode(errors="replace").splitlines()[1:]  # cut, or step 1 (warm-up)
    except OSError:
        lines = []
    records = []
    for line in lines[-WINDOW - 1:]:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # the line being written
    records = records[-WINDOW:]
    return {"compute_ms_per_seq": per_sequence(records, skip=0), "share": records[-1].get("share") if records
            else None, "steps": len(records)}


def run_steps(path: str) -> int | None:
    """The steps the built-in trainer was given (its out/config.json): the run's own total, which a
    status asked with other settings (say, without the launch's -e ddplab_trainer_steps) must not change."""
    try:
        with open(path) as f:
            steps = json.load(f).get("steps")
    except (OSError, ValueError, AttributeError):
        return None
    return steps if isinstance(steps, int) and steps > 0 else None


def membership(path: str, keep: int = 20) -> list[dict]:
    """The last groups of an elastic run as this node saw them (trainer/elastic.py writes the file)."""
    out = []
    for line in tail_lines(path, keep):
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
