"""`python -m ddplab tune -i INVENTORY`: which layout trains fastest on this lab, measured.

The field notes' question: one process per node, several, or every node? The run you configured (your
entry point with its arguments, or the built-in trainer) trains for at most --seconds in each layout:

    1x1   the master alone, 1 process with all its cores
    1xN   the master alone, N processes (--procs, default 2), the cores split between them
    all   every node of the inventory, as launch.yml starts it (ddplab_nproc_per_node per node)

The two layouts on the master alone run as local ranks over loopback gloo (nodeprobe/code_smoke.py, the
launcher of the smoke run: nothing listens beyond loopback, the code runs in a scratch copy);
`all` runs through launch.yml (prepared and checked first), is stopped after --seconds and its logs
collected. Tokens/s come from what the run printed (nodeprobe/log_metrics.py: nanochat's tok/sec,
nanoGPT's iter lines with its tokens per iteration, the built-in trainer's progress line, or
ddplab_log_pattern), as the median over its steps after the first, with the min-max; the all-reduce
share of a step where the output gives it (the built-in trainer; a pattern with allreduce_ms).

Writes runs/<tune id>/tune.md, tune.json and tune.png (tokens/s per layout) and prints the table and the
layout to use.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from ddplab import inventory
from ddplab.errors import DdplabError
from nodeprobe import log_metrics

REPO = Path(__file__).resolve().parents[1]
PLAYBOOKS = REPO / "playbooks"
TIMED_OUT = "still running after"  # roles/launch/tasks/poll.yml's message when the wait ends first
PROGRESS_MARK = '"msg": "running'  # the wait's progress lines (roles/launch/tasks/poll.yml)


def tune_id() -> str:
    return time.strftime("tune-%Y%m%d-%H%M%S")


def layout_figures(name: str, nodes: int, procs: int, records: list[dict], note: str = "") -> dict:
    """One layout's row: median tokens/s over the steps after the first (warm-up), with its min-max."""
    tps = log_metrics.timed(records, "tokens_per_sec")
    dt = log_metrics.timed(records, "dt_ms")
    ar = log_metrics.timed(records, "allreduce_ms")
    share = log_metrics.median([a / d for a, d in zip(ar, dt, strict=True) if d]) \
        if ar and len(ar) == len(dt) else None
    return {"layout": name, "nodes": nodes, "procs_per_node": procs, "steps": len(records),
            "tokens_per_sec": log_metrics.median(tps), "tokens_per_sec_min": min(tps) if tps else None,
            "tokens_per_sec_max": max(tps) if tps else None, "step_ms": log_metrics.median(dt),
            "allreduce_share": share, "note": note}


def recommend(rows: list[dict]) -> str:
    """The layout to use: the most tokens/s; how it compares with the master alone."""
    measured = [r for r in rows if r["tokens_per_sec"]]
    if not measured:
        return "no layout printed a step with tokens/s: see the logs in this folder"
    best = max(measured, key=lambda r: r["tokens_per_sec"])
    base = next((r for r in measured if r["layout"] == "1x1"), None)
    gain = f" ({best['tokens_per_sec'] / base['tokens_per_sec']:.2f}x the master alone with 1 process)" \
        if base and best is not base else ""
    how = {"1x1": "one node, ddplab_nproc_per_node: 1 (a second machine costs more in communication than it "
                  "adds)",
           "all": "every node (launch.yml as configured)"}.get(
        best["layout"], f"one node, ddplab_nproc_per_node: {best['procs_per_node']}")
    return f"use {best['layout']}: {how}{gain}"


def _fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def markdown(tune: dict) -> str:
    lines = [f"# Tune {tune['id']}", "",
             f"- what ran: {tune['what']}", f"- seconds per layout: {tune['seconds']}",
             f"- master: {tune['master']}; nodes: {', '.join(tune['nodes'])}", "",
             "| layout | nodes x procs | steps | tokens/s (median) | min-max | step ms | all-reduce share "
             "| note |", "|---|---|---|---|---|---|---|---|"]
    for r in tune["rows"]:
        share = "-" if r["allreduce_share"] is None else f"{100 * r['allreduce_share']:.0f} %"
        lines.append(f"| {r['layout']} | {r['nodes']} x {r['procs_per_node']} | {r['steps']} | "
                     f"{_fmt(r['tokens_per_sec'])} | {_fmt(r['tokens_per_sec_min'])}-"
                     f"{_fmt(r['tokens_per_sec_max'])} | {_fmt(r['step_ms'], '.1f')} | {share} | "
                     f"{r['note']} |")
    lines += ["", f"**{tune['advice']}**", ""]
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["layout"] for r in rows]
    med = [r["tokens_per_sec"] or 0 for r in rows]
    err = [[m - (r["tokens_per_sec_min"] or m) for m, r in zip(med, rows, strict=True)],
           [(r["tokens_per_sec_max"] or m) - m for m, r in zip(med, rows, strict=True)]]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(names, med, yerr=err, capsize=4, color="#4c72b0")
    ax.set_ylabel("tokens/s (median, min-max)")
    ax.set_title("tokens/s per layout")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write(tune: dict, out: Path) -> None:
    (out / "tune.json").write_text(json.dumps(tune, indent=2) + "\n")
    (out / "tune.md").write_text(markdown(tune))
    plot(tune["rows"], out / "tune.png")


def playbook(inv: str, name: str, extra: dict, log: Path, show_progress: bool = False) -> int:
    """ansible-playbook, its output into log; with show_progress the wait's progress lines are echoed."""
    cmd = [str(Path(sys.executable).with_name("ansible-playbook")), "-i", inv, str(PLAYBOOKS / name),
           "-e", json.dumps(extra)]
    if not os.path.exists(cmd[0]):
        cmd[0] = shutil.which("ansible-playbook") or "ansible-playbook"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "ANSIBLE_NOCOLOR": "1"})
        for line in proc.stdout:
            f.write(line)
            if show_progress and PROGRESS_MARK in line:
                print("  " + line.split('"msg": ', 1)[1].strip().strip('"')[:150], flush=True)
        return proc.wait()


def run_local(inv: str, out: Path, procs: int, seconds: int) -> dict:
    """The master alone with `procs` local ranks: playbooks/tune_node.yml brings back <layout>.json."""
    name = f"1x{procs}"
    print(f"ddplab tune: {name} on the master (up to {seconds} s)", flush=True)
    rc = playbook(inv, "tune_node.yml", {"tune_procs": procs, "tune_seconds": seconds, "tune_dest": str(out)},
                  out / f"{name}.ansible.log")
    result = out / f"{name}.json"
    if rc != 0 or not result.exists():
        return layout_figures(name, 1, procs, [], note=f"failed: see {name}.ansible.log")
    got = json.loads(result.read_text())
    note = got.get("note", "")
    return layout_figures(name, 1, procs, got.get("records", []), note=note)


def run_all(inv: str, out: Path, rid: str, seconds: int, master: str, pattern: str) -> dict:
    """Every node, through launch.yml; stopped after `seconds` (or at its end), then collected."""
    print(f"ddplab tune: all nodes, run {rid} (up to {seconds} s of training)", flush=True)
    runs = out / "runs"
    common = {"ddplab_run_id": rid, "ddplab_runs_dir": str(runs)}
    rc = playbook(inv, "launch.yml", {**common, "ddplab_wait": True, "ddplab_wait_timeout": seconds},
                  out / "all.ansible.log", show_progress=True)
    timed_out = rc != 0 and TIMED_OUT in (out / "all.ansible.log").read_text()
    if rc != 0 and not timed_out:
        return layout_figures("all", 0, 0, [], note="failed: see all.ansible.log")
    if timed_out:
        playbook(inv, "stop.yml", common, out / "all.stop.log")
        playbook(inv, "collect_logs.yml", common, out / "all.collect.log")
    log = runs / rid / master / "launch.log"
    records = log_metrics.read_log(str(log), pattern, whole=True)["records"] if log.exists() else []
    summary = runs / rid / "summary.json"
    nodes = json.loads(summary.read_text()).get("hosts") if summary.exists() else None
    return layout_figures("all", len(nodes) if isinstance(nodes, list) else 0, 0, records,
                          note="stopped after the time limit" if timed_out else "ran to its end")


def cmd_tune(args) -> int:
    nodes, hostvars = inventory.load_nodes(args.inventory), inventory.load_hostvars(args.inventory)
    master = nodes[0].name
    hv = hostvars.get(master, {})
    pattern = hv.get("ddplab_log_pattern", "") or ""
    what = (f"{hv.get('ddplab_entrypoint')} {' '.join(map(str, hv.get('ddplab_entrypoint_args') or []))}"
            if hv.get("ddplab_entrypoint") else "the built-in trainer")
    tid = args.id or tune_id()
    out = Path(args.out or REPO / "runs") / tid
    out.mkdir(parents=True, exist_ok=False)
    rows = [run_local(args.inventory, out, 1, args.seconds)]
    if args.procs > 1:
        rows.append(run_local(args.inventory, out, args.procs, args.seconds))
    if len(nodes) > 1:
        row = run_all(args.inventory, out, f"{tid}-all", args.seconds, master, pattern)
        row["nodes"] = row["nodes"] or len(nodes)
        row["procs_per_node"] = row["procs_per_node"] or int(hv.get("ddplab_nproc_per_node", 1) or 1)
        rows.append(row)
    tune = {"id": tid, "what": what.strip(), "seconds": args.seconds, "master": master,
            "nodes": [n.name for n in nodes], "rows": rows}
    tune["advice"] = recommend(rows)
    write(tune, out)
    print(markdown(tune))
    print(f"ddplab tune: wrote {out}/tune.md, tune.json, tune.png")
    return 0 if any(r["tokens_per_sec"] for r in rows) else 1


def add_parser(sub):
    p = sub.add_parser("tune", help="tokens/s of 1 node x 1 process, 1 node x N processes and all nodes")
    p.add_argument("-i", "--inventory", required=True, help="the lab's inventory (ansible-playbook -i)")
    p.add_argument("--seconds", type=int, default=120, help="longest time each layout trains (default 120)")
    p.add_argument("--procs", type=int, default=2, help="processes of the 1xN layout (default 2; 1: skip it)")
    p.add_argument("--id", default="", help="the tune's id (default tune-<date>-<time>)")
    p.add_argument("--out", default="", help="folder for runs/<id>/ (default the repository's runs/)")
    p.set_defaults(func=cmd_tune)


if __name__ == "__main__":
    raise DdplabError("run it as: python -m ddplab tune -i INVENTORY")
