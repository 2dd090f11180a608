"""The launch role's two node steps, each one process driven by a JSON spec on stdin.

    python -m nodeprobe launch-facts < spec   # what the launch needs to know (read-only)
    python -m nodeprobe start-rank   < spec   # write the run's files and start the rank in tmux
                                              # (scheduler "slurm": write them only; the job starts them)

Two round trips instead of a dozen small tasks (read the Python, count CPUs, look for the session, stat
the entry point, find checkpoints; then folder, environment, script, code record, exit marker, run id,
tmux): a relaunch on a prepared lab is dominated by per-task SSH latency, not by the work.

The control host renders launch.sh and trainer.env from the role's templates and hands their text over
in the start-rank spec; this module only places files and starts tmux, so it decides nothing about
what the rank runs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

from nodeprobe.place_files import write_file
from nodeprobe.spec import SpecError, read_spec  # noqa: F401 (SpecError: callers catch it here)


def cpu_set() -> list[int]:
    """The CPUs this process may run on (as `nproc`: the affinity mask, not the machine's total)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def machine_id() -> str:
    """The running kernel's boot id: one for every container and namespace of a machine, another on each
    machine and VM ("" where there is none), so hosts that share CPUs are told apart from hosts that don't."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def session_state(socket: str, session: str) -> str:
    """``none`` (no such tmux session), ``live`` (a pane still runs) or ``dead`` (every pane exited)."""
    try:
        out = subprocess.run(["tmux", "-S", socket, "list-panes", "-t", f"={session}", "-F", "#{pane_dead}"],
                             capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    if out.returncode != 0:
        return "none"
    return "live" if "0" in out.stdout.split() else "dead"


def launch_facts(spec: dict) -> dict:
    python = str(spec.get("python") or "")
    if not python and spec.get("python_file"):
        try:
            python = Path(spec["python_file"]).read_text().strip()
        except OSError:
            python = ""
    script = str(spec.get("script") or "")
    ckpt_dir = Path(spec["ckpt_dir"]) if spec.get("ckpt_dir") else None
    ckpts = sorted(p.name for p in ckpt_dir.glob("step_*.pt")) if ckpt_dir and ckpt_dir.is_dir() else []
    cpus = cpu_set()
    return {"probe": "launch-facts", "python": python, "nproc": len(cpus), "cpus": cpus,
            "machine": machine_id(), "session": session_state(spec["socket"], spec["session"]),
            "script_exists": Path(script).is_file() if script else None, "ckpts": ckpts}


def tmux_argv(spec: dict, replace_dead: bool = False) -> list[str]:
    """One tmux client for the whole start. A dead session of the same run is killed inside it: killed by
    a separate client, the last session takes the server down while the next client may already be
    connecting to it ("server exited unexpectedly"); a server never exits while a client is attached."""
    tmux = spec.get("tmux") or {}
    replace = ["kill-session", "-t", f"={spec['session']}", ";"] if replace_dead else []
    return ["tmux", "-S", spec["socket"], "-f", "/dev/null", "start-server", ";",
            "set-option", "-g", "history-limit", str(int(tmux.get("history", 200000))), ";",
            "set-option", "-g", "remain-on-exit", "on", ";", *replace,
            "new-session", "-d", "-s", spec["session"], "-x", str(int(tmux.get("width", 200))),
            "-y", str(int(tmux.get("height", 50))), "-c", spec["cwd"],
            f"/bin/bash {shlex.quote(str(Path(spec['run_dir']) / 'launch.sh'))}"]


def start_rank(spec: dict) -> dict:
    """Replace a dead session of the same run, place the run's files, start the rank. Refuses a live
    session (the control host checked, but a second launch may have raced it)."""
    state = session_state(spec["socket"], spec["session"])
    if state == "live":
        raise RuntimeError(f"run {spec['session']} is still running in tmux; stop it first")
    run_dir = Path(spec["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
    for f in spec.get("files") or []:
        write_file(run_dir / f["name"], f["content"], int(str(f["mode"]), 8))
    if spec.get("code_json"):
        shutil.copyfile(spec["code_json"], run_dir / "code.json")
        os.chmod(run_dir / "code.json", 0o644)
    (run_dir / "exit_code").unlink(missing_ok=True)
    if spec.get("last_run_file"):
        write_file(Path(spec["last_run_file"]), f"{spec['session']}\n", 0o644)
    if spec.get("scheduler") == "slurm":  # the Slurm job's srun step runs launch.sh on this node
        return {"probe": "start-rank", "started": False, "placed": True, "replaced_dead_session": False,
                "run_dir": str(run_dir)}
    env = {k: v for k, v in os.environ.items() if k != "TMUX"}  # started from inside tmux: still a new server
    out = subprocess.run(tmux_argv(spec, replace_dead=state == "dead"), capture_output=True, text=True,
                         timeout=30, check=False, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"tmux did not start the session: {(out.stderr or out.stdout).strip()}")
    return {"probe": "start-rank", "started": True, "replaced_dead_session": state == "dead",
            "run_dir": str(run_dir)}


def run(verb: str, text: str) -> dict:
    if verb == "launch-facts":
        return launch_facts(read_spec(text, ("socket", "session")))
    return start_rank(read_spec(text, ("socket", "session", "run_dir", "cwd")))
