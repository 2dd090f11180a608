"""Read-only state of one ddplab run on this node, as one JSON line.

Usage: run_status.py RUN_DIR SOCKET SESSION. state is one of: not-started (no run folder), running,
exited (with code), lost (no exit code and no live tmux pane: the rank was killed with its session).
Standard library only.
"""

import glob
import json
import os
import subprocess
import sys


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


def main():
    run_dir, socket, session = sys.argv[1:4]
    res = {"state": "not-started", "code": None, "step": None, "loss": None, "tokens_per_sec": None,
           "last_line": "", "pane": None}
    if not os.path.isdir(run_dir):
        print(json.dumps(res))
        return
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
        res["state"] = "running" if res["pane"] and not res["pane"]["dead"] else "lost"
    for path in sorted(glob.glob(os.path.join(run_dir, "out", "metrics.rank*.jsonl"))):
        rec = last_line(path, want_json=True)
        if rec and (res["step"] is None or rec.get("step", -1) >= res["step"]):
            res.update(step=rec.get("step"), loss=rec.get("loss"), tokens_per_sec=rec.get("tokens_per_sec"))
    res["last_line"] = (last_line(os.path.join(run_dir, "launch.log")) or "")[-300:]
    print(json.dumps(res))


if __name__ == "__main__":
    main()
