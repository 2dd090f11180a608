"""`python -m ddplab status`: judge every node of a run and name the node that failed first.

Input (JSON on stdin), built by roles/launch/tasks/status.yml from the node-side states
(`nodeprobe` run status, one per node that answered):

    {"run": "run-1", "log_dir": "~/ddplab/runs",
     "nodes": {"node0": 0, "node1": 1},                 # every node of the inventory: its rank
     "asked": ["node0", "node1"],                        # the nodes of the play (--limit applied)
     "states": {"node0": {...run status...}},            # the asked nodes that answered
     "lost": ["node2"]}                                  # elastic: nodes the wait saw go (optional)

A node outside --limit is "not asked", never "not answering"; an asked node without a state did not
answer over SSH: it is "not answering" (asleep, frozen, off or cut off: not known to have failed), and when
it stopped the run its line says so instead of "failed first". "Failed first" is judged among the nodes
whose state is known: a node not answering or silently lost first, else the failed node whose rank did
not merely lose a peer (or, a Slurm run, was not ended by Slurm because another node of its job failed:
NODE_FAIL), earliest exit first (exit_code mtimes on the nodes' clocks). When nothing known failed but
nodes were left out, the failed-first node is unknown, and the output says so.
With ddplab_elastic a node that went away (``lost``) did not fail the run: the others went on without
it. Its row says so, and the membership history of the group (from the nodes' membership.jsonl, via
their run status) is printed: who left, who joined, at which step and how many steps were lost.
A row's step is `step/total` when the total is known (the built-in trainer's steps, or what your code
printed: nodeprobe/log_metrics.py), the step alone otherwise; a running node's row adds its eta when known.
A failed node's row shows why: its `ddplab: error:` line, else the exception its code raised (`exception`
of the run status, nodeprobe/rank_error.py), else its last log line.
Output: JSON {"run", "nodes": [rows], "failed", "failed_first", "not_answering", "stragglers", "lines"} on
stdout.
"""

from __future__ import annotations

import json
import sys
import time

from ddplab.errors import DdplabError
from nodeprobe.cpu_power import GOVERNOR_FIX
from nodeprobe.log_metrics import fmt_duration
from trainer import straggler_rule

NOT_ASKED = "not asked (left out by --limit)"
# An asked node whose SSH gives no answer: asleep (a closed lid), frozen, switched off or cut off. Not
# "failed": nothing is known of its rank, which may well run on once it wakes.
NOT_ANSWERING = "not answering"
WHY_SILENT = "no answer over SSH: asleep (lid closed), frozen, switched off or cut off"
VERDICTS = {"running": "running", "not-started": "not started", "stopped": "stopped (stop.yml)",
            "queued": "queued (its Slurm job waits for the nodes)",
            "lost": "failed (no exit code, its tmux pane is gone)"}


# The job states (squeue %T) in which Slurm ended the job's ranks because one of its nodes failed.
SLURM_NODE_FAILED = ("NODE_FAIL",)

LEFT = "left the run (the others went on)"
REJOINED = "went away, then rejoined"


def row_for(host: str, rank, state: dict | None, asked: bool, lost: bool = False) -> dict:
    """One node's row: its verdict, whether it failed, and what orders the failed ones."""
    row = {"host": host, "rank": rank, "asked": asked, "known": False, "failed": False, "victim": 0, "t": 0.0,
           "code": None, "step": None, "total": None, "eta_s": None, "loss": None, "tps": None,
           "last_line": "", "lines": [], "error": None}
    if lost:
        return {**row, "verdict": LEFT, "known": True, "last_line": "no answer over SSH since it went away"}
    if not asked:
        return {**row, "verdict": NOT_ASKED}
    if state is None:
        return {**row, "verdict": NOT_ANSWERING, "known": True, "failed": True, "last_line": WHY_SILENT}
    kind, code = state.get("state"), state.get("code")
    verdict = VERDICTS.get(kind, "finished" if code == 0 else f"failed (exit code {code})")
    if kind == "lost" and state.get("job_state"):  # a Slurm run: no exit code, job over
        verdict = f"failed (no exit code; its Slurm job is {state['job_state']})"
    failed = kind == "lost" or (kind == "exited" and code != 0)
    # Slurm ended this rank because a node of its job failed (NODE_FAIL): a victim, as a rank that lost a peer
    victim = state.get("lost_peer") or (kind == "lost" and state.get("job_state") in SLURM_NODE_FAILED)
    exited_at = (state.get("code_time") or state.get("log_time") or 0.0) if kind == "exited" else 0.0
    return {**row, "verdict": verdict, "known": True, "failed": failed,
            "victim": 1 if victim else 0, "t": float(exited_at), "code": code,
            "step": state.get("step"), "total": state.get("total"), "eta_s": state.get("eta_s"),
            "loss": state.get("loss"), "tps": state.get("tokens_per_sec"),
            "last_line": state.get("last_line") or "", "lines": list(state.get("last_lines") or []),
            "error": state.get("error") or (state.get("exception") if failed else None)}


def judge(doc: dict) -> dict:
    """Rows for every node, the failed ones, and the one that failed first (None when unknown)."""
    try:
        nodes, asked, states = doc["nodes"], set(doc["asked"]), doc.get("states") or {}
        run = doc["run"]
    except (KeyError, TypeError) as e:
        raise DdplabError(f"status input lacks {e}; it is built by roles/launch/tasks/status.yml") from None
    lost = set(doc.get("lost") or [])
    history = max((s.get("membership") or [] for s in states.values() if s), key=len, default=[])
    rows = [row_for(host, rank, states.get(host), host in asked or host in lost, host in lost)
            for host, rank in nodes.items()]
    back = set(history[-1].get("nodes") or []) & lost if history else set()
    for r in rows:
        if r["host"] in back:  # went away, then was started again (start.yml --limit) and joined
            r["verdict"], r["last_line"] = REJOINED, "in the last group of the run (see the membership)"
    failed = sorted((r for r in rows if r["failed"]), key=lambda r: (r["victim"], r["t"]))
    left_out = [r["host"] for r in rows if not r["asked"]]
    first = failed[0]["host"] if failed else None
    slow = stragglers(states)
    lines = (render(run, rows, first, left_out, doc.get("log_dir", "")) + straggler_lines(slow)
             + membership_lines(history))
    return {"run": run, "nodes": rows, "failed": [r["host"] for r in failed], "failed_first": first,
            "not_answering": [r["host"] for r in rows if r["verdict"] == NOT_ANSWERING],
            "left_out": left_out, "lost": sorted(lost), "membership": history, "stragglers": slow,
            "lines": lines}


def stragglers(states: dict) -> list[dict]:
    """The ranks whose newest steps computed straggler_rule.RATIO times the others' median per sequence
    (each node's run status `speed`), slowest first."""
    speeds = {(host, rank): (fig or {}).get("compute_ms_per_seq")
              for host, state in states.items() if state for rank, fig in (state.get("speed") or {}).items()}
    shares = {(host, rank): (fig or {}).get("share")
              for host, state in states.items() if state for rank, fig in (state.get("speed") or {}).items()}
    balanced = len({v for v in shares.values() if v}) > 1  # --balance moved the shares apart
    return [{"host": host, "rank": int(rank), "times": round(times, 2), "share": shares[host, rank],
             "ms_per_seq": round(speeds[host, rank], 1), "balanced": balanced}
            for (host, rank), times in sorted(straggler_rule.named(speeds).items(), key=lambda kv: -kv[1])]


def straggler_lines(slow: list[dict]) -> list[str]:
    out = []
    for s in slow:
        fix = (f"ddplab_balance already gives it a smaller share ({s['share']} sequences a step)"
               if s["balanced"] else "or set ddplab_balance: true (a smaller share of the batch for it)")
        out.append(f"straggler: {s['host']} (rank {s['rank']}) computes {s['times']:.1f}x the others' median "
                   f"per sequence over its last {straggler_rule.WINDOW} steps; every rank waits for it: "
                   f"check its load, power governor ({GOVERNOR_FIX}) and thermals, {fix}")
    return out


def membership_lines(history: list[dict]) -> list[str]:
    """One line per group of an elastic run: its nodes, who left or joined since the group before, where
    it resumed and the steps lost."""
    out, before = [], None
    for g in history:
        nodes = list(g.get("nodes") or [])
        when = time.strftime("%H:%M:%S", time.localtime(float(g.get("time") or 0)))
        change = ""
        if before is not None:
            left = [n for n in before if n not in nodes]
            joined = [n for n in nodes if n not in before]
            change = "".join([f", {', '.join(left)} left" if left else "",
                              f", {', '.join(joined)} joined" if joined else ""])
        lost = g.get("lost_steps") or 0
        out.append(f"group {when}: {len(nodes)} node(s) ({', '.join(nodes)}){change}; from step "
                   f"{g.get('resumed_step', 0)}" + (f", {lost} steps lost" if lost else ""))
        before = nodes
    return (["membership (elastic run):"] + [f"  {ln}" for ln in out]) if out else []


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def step_text(step, total) -> str:
    """`12/50`, `12` when the total is not known (your code did not print it), `-` before the first step."""
    if step is None:
        return "-"
    return f"{step}/{total}" if total else str(step)


def render(run: str, rows: list[dict], first: str | None, left_out: list[str], log_dir: str) -> list[str]:
    """The lines status.yml prints: a row per node, then who failed first and the failed nodes' last lines."""
    out = [f"run {run}"]
    for r in rows:
        line = r["error"] if r["failed"] and r["error"] else r["last_line"]  # why it failed, else where it is
        line = line if len(line) <= 100 else line[:97] + "..."
        running = r["eta_s"] is not None and r["verdict"] == "running"
        eta = f"eta {fmt_duration(r['eta_s'])} " if running else ""
        out.append(f"{r['host']:<12} rank {fmt(r['rank'], '<2')} {r['verdict']:<32} "
                   f"step {step_text(r['step'], r['total']):<6} loss {fmt(r['loss'], '<8.4f')} "
                   f"tok/s {fmt(r['tps'], '<8.0f')} "
                   f"{eta}| {line}".rstrip())
    if first:
        r = next(r for r in rows if r["host"] == first)
        among = f" among the nodes asked ({', '.join(left_out)} not asked)" if left_out else ""
        if r["verdict"] == NOT_ANSWERING:
            out.append(f"not answering{among}: {r['host']} (rank {r['rank']}): {WHY_SILENT}; its peers wait "
                       "for it up to ddplab_pg_timeout, then stop. Wake it (open the lid) and run status.yml "
                       "again to see its own state")
        else:
            out.append(f"failed first{among}: {r['host']} (rank {r['rank']}, {r['verdict']})"
                       + (f": {r['error']}" if r["error"] else ""))
        for f in rows:
            if f["failed"] and f["lines"]:
                out.append(f"--- last lines of {f['host']} ({log_dir}/{run}/launch.log):")
                if f["error"] and f["error"] not in " ".join(f["lines"]):
                    out.append(f"  {f['error']}")
                out.extend(f"  {ln}" for ln in f["lines"])
    elif left_out:
        out.append(f"failed first: unknown ({', '.join(left_out)} not asked; "
                   "no failure among the nodes asked)")
    return out


def cmd_status(args) -> int:
    try:
        doc = json.load(sys.stdin)
    except json.JSONDecodeError as e:
        raise DdplabError(f"status input is not JSON ({e}); status.yml builds it") from None
    json.dump(judge(doc), sys.stdout)
    print()
    return 0


def add_parser(sub):
    p = sub.add_parser("status", help="judge a run's nodes from their states (JSON on stdin)")
    p.set_defaults(func=cmd_status)
