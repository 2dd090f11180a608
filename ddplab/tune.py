"""`python -m ddplab tune -i INVENTORY`: which layout trains fastest on this lab, measured.

The field notes' question: one process per node, several, or every node? The run you configured (your
entry point with its arguments, or the built-in trainer) trains for at most --seconds in each layout:

    1x1   the master alone, 1 process with all its cores
    1xN   the master alone, N processes (--procs, default 2), the cores split between them
    all   every node of the inventory, as launch.yml starts it (ddplab_nproc_per_node per node)

`all` runs first, through launch.yml (which prepares and checks the lab when it needs it), is stopped
after --seconds and its logs collected. The two layouts on the master alone then run as local ranks over
loopback gloo (playbooks/tune_node.yml, nodeprobe/code_tune.py with the smoke run's launcher: nothing
listens beyond loopback, the code runs in a scratch copy). A lab of one node has no `all`: prepare it
first (launch.yml). Tokens/s come from what the run printed (nodeprobe/log_metrics.py: nanochat's tok/sec,
nanoGPT's iter lines with its tokens per iteration, the built-in trainer's progress line, or
ddplab_log_pattern), as the median over its steps after the first, with the min-max; the all-reduce
share of a step where the output gives it (the built-in trainer; a pattern with allreduce_ms).

Writes runs/<tune id>/tune.md, tune.json and tune.png (tokens/s per layout) and prints the table and the
layout to use.
"""

from __future__ import annotations

import contextlib
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
             f"- what ran: {tune['what']}",
             f"- seconds per layout and round: {tune['seconds']}",
             f"- rounds (interleaved): {tune.get('rounds', 1)}",
             f"- master: {tune['master']}; nodes: {', '.join(tune['nodes'])}", "",
             "| layout | nodes x procs | steps | tokens/s (median) | min-max over steps | step ms "
             "| all-reduce share | note |", "|---|---|---|---|---|---|---|---|"]
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


def run_local(inv: str, out: Path, rid: str, procs: int, seconds: int) -> tuple[list, str]:
    """The master alone with `procs` local ranks (playbooks/tune_node.yml): (records, note)."""
    print(f"ddplab tune: {rid}: the master alone, {procs} process(es), up to {seconds} s", flush=True)
    rc = playbook(inv, "tune_node.yml", {"tune_procs": procs, "tune_seconds": seconds, "tune_dest": str(out),
                                         "ddplab_run_id": rid}, out / f"{rid}.ansible.log")
    result = out / f"1x{procs}.json"
    if rc != 0 or not result.exists():
        return [], f"failed: see {rid}.ansible.log"
    got = json.loads(result.read_text())
    result.rename(out / f"{rid}.json")
    with contextlib.suppress(OSError):
        (out / f"1x{procs}.log").rename(out / f"{rid}.log")
    return got.get("records", []), got.get("note", "")


def run_all(inv: str, out: Path, rid: str, seconds: int, master: str, pattern: str) -> tuple[list, str]:
    """Every node, through launch.yml; stopped after `seconds` (or at its end), then collected:
    (records of the master's log, note)."""
    print(f"ddplab tune: {rid}: every node, up to {seconds} s of training", flush=True)
    runs = out / "runs"
    common = {"ddplab_run_id": rid, "ddplab_runs_dir": str(runs)}
    log = out / f"{rid}.ansible.log"
    rc = playbook(inv, "launch.yml", {**common, "ddplab_wait": True, "ddplab_wait_timeout": seconds}, log,
                  show_progress=True)
    timed_out = rc != 0 and TIMED_OUT in log.read_text()
    if rc != 0 and not timed_out:
        return [], f"failed: see {rid}.ansible.log"
    if timed_out:
        playbook(inv, "stop.yml", common, out / f"{rid}.stop.log")
        playbook(inv, "collect_logs.yml", common, out / f"{rid}.collect.log")
    launch_log = runs / rid / master / "launch.log"
    if not launch_log.exists():
        return [], "no launch.log of the master collected"
    records = log_metrics.read_log(str(launch_log), pattern, whole=True)["records"]
    return records, "stopped after the time limit" if timed_out else "ran to its end"


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
    # (name, nodes, processes per node); all first: launch.yml prepares the lab when it needs it
    per_node = int(hv.get("ddplab_nproc_per_node", 1) or 1)
    layouts = ([("all", len(nodes), per_node)] if len(nodes) > 1 else []) + [("1x1", 1, 1)] \
        + ([(f"1x{args.procs}", 1, args.procs)] if args.procs > 1 else [])
    got = {name: ([], []) for name, _n, _p in layouts}
    for k in range(1, args.rounds + 1):  # interleaved: other work on the machines moves every layout alike
        for name, _n, procs in layouts:
            rid = f"{tid}-{name}-r{k}"
            records, note = (run_all(args.inventory, out, rid, args.seconds, master, pattern) if name == "all"
                             else run_local(args.inventory, out, rid, procs, args.seconds))
            got[name][0].extend(records[1:] if k > 1 else records)  # each round's first step warms up
            got[name][1].append(note)
    rows = [layout_figures(name, n, procs, got[name][0], note="; ".join(dict.fromkeys(got[name][1])))
            for name, n, procs in sorted(layouts, key=lambda x: (x[1], x[2]))]
    tune = {"id": tid, "what": what.strip(), "seconds": args.seconds, "rounds": args.rounds, "master": master,
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
    p.add_argument("--rounds", type=int, default=1, help="interleaved rounds of every layout (default 1)")
    p.add_argument("--procs", type=int, default=2, help="processes of the 1xN layout (default 2; 1: skip it)")
    p.add_argument("--id", default="", help="the tune's id (default tune-<date>-<time>)")
    p.add_argument("--out", default="", help="folder for runs/<id>/ (default the repository's runs/)")
    p.set_defaults(func=cmd_tune)


if __name__ == "__main__":
    raise DdplabError("run it as: python -m ddplab tune -i INVENTORY")
