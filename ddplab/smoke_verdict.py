"""``python -m ddplab smoke-verdict``: the launch's decision from the smoke run of the user's code.

The master ran the entry point as 2 CPU ranks over loopback gloo (nodeprobe/code_smoke.py) and printed
what it saw; this reads that JSON on stdin and says, in one message naming the node, the place and the
patch, whether the ranks may start. The static CPU check (ddplab/code_check.py) adds its hint for the
same place where it has one. The smoke run decides: code that trained passes whatever the scan guessed.
A scan error whose line ran (the JSON's ``ran``: the lines of the user's files that ran on a smoke rank)
is contradicted and shown as a note; one whose line never ran is still a guess, shown as a warning. Only
when the smoke run could not judge (the time ran out before a rank made an optimizer step) do the scan's
errors refuse, as they do with the smoke run off.
Exit 0: the ranks may start; 1: refused; 2: bad input.
"""

from __future__ import annotations

import json
import sys

from ddplab.code_check import check
from ddplab.cpu_patterns import Finding
from ddplab.errors import DdplabError

# The scan's findings that explain a smoke problem with no file:line of its own.
HINT_KINDS = {"no-group": {"pg-only-on-cuda", "nccl"}, "bad-group": {"nccl", "pg-only-on-cuda"},
              "no-collectives": {"ddp-device-ids", "pg-only-on-cuda"}, "crash": set(), "disagree": set(),
              "no-training": {"cuda-required"}, "rank-layout": set(), "missing-module": {"cuda-import"},
              "shard-layout": set(), "shard-cover": set(), "download": set()}


def line_ran(result: dict, path: str, line: int) -> bool:
    """Whether `path`:`line` ran on a smoke rank (the JSON's ``ran``: {file: "1-5,7"})."""
    for part in filter(None, (result.get("ran") or {}).get(path, "").split(",")):
        first, _, last = part.partition("-")
        if int(first) <= line <= int(last or first):
            return True
    return False


def hints_for(problem: dict, findings: list[Finding], result: dict | None = None) -> list[Finding]:
    """The scan's findings of the kinds that explain the problem (those whose line ran, when any did) and
    its errors at the problem's place; failing those, its warnings there."""
    at = [f for f in findings if problem.get("where") and f"{f.path}:{f.line}" == problem["where"]]
    kinds = set(HINT_KINDS.get(problem["kind"], set()))
    if problem["kind"] == "crash" and "process group" in problem["what"]:
        kinds.add("pg-only-on-cuda")  # a collective without a group: the group was made on CUDA only
    hints = [f for f in findings if f.kind in kinds]
    reached = [f for f in hints if line_ran(result or {}, f.path, f.line)]
    hints = reached or hints
    if problem["kind"] == "missing-module":  # the scan's word on that package only
        hints = [f for f in hints if f"import {problem.get('module')}" in f.what]
    hints += [f for f in at if f.severity == "error" and f not in hints]
    return hints or at


def summary(result: dict) -> str:
    """What the ranks did: their steps, the parameters' agreement and the collectives; for FSDP2 also how
    the shards split the model and the all-gathers and reduce-scatters counted."""
    ranks = result.get("ranks") or []
    ops = [r.get("ops_before_first_step") or 0 for r in ranks]
    steps = min((r.get("steps") or 0 for r in ranks), default=0)
    compiled = (f"; {result['compile_s']:g} s of torch.compile, not counted against ddplab_smoke_seconds"
                if result.get("compile_s") else "")
    shards = [r.get("shards") for r in ranks]
    if ranks and all(shards):
        held = ", ".join(f"rank {r['rank']} {s['local_numel']:,}" for r, s in zip(ranks, shards, strict=True))
        calls = ranks[0].get("calls") or {}
        kinds = ", ".join(f"{calls[k]} {k}" for k in sorted(calls) if calls[k])
        return (f"it trains as one sharded (FSDP2) run: {steps} optimizer steps on each rank, "
                f"{shards[0]['params']} parameters sharded over a device mesh of {shards[0]['mesh_size']}, "
                f"their {shards[0]['global_numel']:,} values held once ({held}), the other parameters equal "
                f"across the ranks, {min(ops, default=0)}+ collectives before the first step (rank 0 in "
                f"all: {kinds or 'none by name'}){compiled}")
    return (f"it trains as one DDP run: {steps} optimizer steps on each rank, parameters equal across the "
            f"ranks, {min(ops, default=0)}+ collectives before the first step{compiled}")


def pass_said(result: dict, problem: dict) -> str:
    """Which pass of a whole smoke run failed (the second resumes from the first's checkpoint)."""
    if problem.get("pass") != "resume":
        return "; the whole run with ddplab_smoke_args" if result.get("whole") else ""
    second = (result.get("passes") or [{}, {}])[-1]
    saved = ", ".join((result.get("passes") or [{}])[0].get("checkpoints") or []) or "its checkpoint"
    return (f"; the second pass, which resumed from {saved} with arguments "
            f"{' '.join(second.get('args') or []) or '(none)'}")


def passes_said(result: dict) -> str:
    """What a whole smoke run ran, for its pass line."""
    done = result.get("passes") or []
    if not result.get("whole") or not done:
        return ""
    said = f"; it ran to its end with ddplab_smoke_args ({done[0]['seconds']:g} s)"
    if len(done) > 1:
        said += (f" and again resuming from {', '.join(done[0]['checkpoints'])} ({done[1]['seconds']:g} s, "
                 f"arguments {' '.join(done[1]['args']) or '(none)'})")
    else:
        said += "; it saved no checkpoint (torch.save), so no resume was tried"
    return said


def scan_notes(result: dict, errors: list[Finding]) -> list[str]:
    """After a pass, the scan's errors: contradicted where their line ran, still standing where not."""
    lines = []
    for f in errors:
        if line_ran(result, f.path, f.line):
            lines.append(f"ddplab: note: the CPU check's guess {f.path}:{f.line} ({f.what}) is contradicted: "
                         "the smoke run ran that line")
        else:
            lines.append(f"ddplab: warning: {f.path}:{f.line} ({f.what}) never ran in the smoke run: the CPU "
                         f"check's error stands where the run gets there; patch: {f.patch}"
                         + ("" if result.get("whole") else " (ddplab_smoke_args runs the whole script, its "
                            "evaluation and checkpoint too)"))
    return lines


def fetch_notes(result: dict) -> list[str]:
    """After a pass, the hosts the code downloaded from (each node will, at every start)."""
    return [f"ddplab: note: rank {f['rank']} looked up {f['host']}"
            + (f" at {f['where']['file']}:{f['where']['line']}" if f.get("where") else "")
            + ": every node downloads from it at every start, and a node with no route to it fails there; "
            "ship the file in ddplab_code_include or ddplab_sync_dirs" for f in result.get("fetches") or []]


def decide(result: dict, node: str, entry: str, findings: list[Finding]) -> tuple[int, list[str]]:
    """(exit code, lines) for the smoke run's result on `node`."""
    verdict, seconds = result.get("verdict"), result.get("seconds", 0)
    errors = [f for f in findings if f.severity == "error"]
    what = f"the smoke run of {entry} on {node} (2 CPU ranks over loopback gloo"
    if result.get("error") or verdict not in ("pass", "cached", "fail", "inconclusive"):
        return 1, [f"ddplab: error: {what}) did not run: {result.get('error') or result}; "
                   "run playbooks/prepare.yml, or set ddplab_smoke_run: false to rely on the CPU check alone"]
    if verdict == "cached":
        return 0, [f"ddplab: {what}) passed before for this code, arguments, ddplab_env and torch: "
                   "not run again"]
    if verdict == "pass":
        said = f"passed; note: {result['note']}" if result.get("note") else summary(result)
        return 0, [f"ddplab: {what}, {seconds:g} s): {said}{passes_said(result)}",
                   *scan_notes(result, errors), *fetch_notes(result)]
    if verdict == "inconclusive":
        lines = [f"ddplab: warning: {what}, {seconds:g} s) could not judge: {result.get('note', '')}"]
        if errors:
            lines += [f.text() for f in errors]
            lines.append("ddplab: the launch is refused by the CPU check: patch the lines above, raise "
                         "ddplab_smoke_seconds so the smoke run reaches an optimizer step, or set "
                         "ddplab_code_check: false")
            return 1, lines
        return 0, lines
    first = result["problems"][0]
    hints = hints_for(first, findings, result)
    where = first.get("where") or next((f"{f.path}:{f.line} (the CPU check's place)" for f in hints
                                        if line_ran(result, f.path, f.line)), None)
    place = f" at {where}" if where else ""
    fix = first["fix"]
    if first["kind"] == "missing-module" and any(f.kind == "cuda-import" for f in hints):
        fix = f"{first['module']} needs a GPU, do without it on CPU"  # installing it would not help
    message = (f"ddplab: error: {what}, {seconds:g} s{pass_said(result, first)}): {first['what']}{place}; "
               f"patch: {fix}")
    if hints:
        message += "; the CPU check: " + " | ".join(
            f"{f.path}:{f.line}: {f.what}; patch: {f.patch}" for f in hints)
    lines = [message]
    lines += [f"ddplab: error: also: {p['what']}" + (f" at {p['where']}" if p.get("where") else "")
              for p in result["problems"][1:]]
    crashed = next((r for r in result.get("ranks") or [] if r.get("rank") == first.get("rank")), None)
    chain = ((crashed or {}).get("error") or {}).get("chain") or []
    if first["kind"] == "crash" and len(chain) > 1:
        lines.append("ddplab: reached through " + " -> ".join(f"{c['file']}:{c['line']} ({c['func']})"
                                                             for c in chain))
    lines.append("ddplab: the launch is refused before any rank starts (nothing was left in your code "
                 "folder); patch the code, or set ddplab_smoke_run: false to rely on the CPU check alone")
    return 1, lines


def node_output(task: dict) -> str:
    """The smoke run's JSON from its ddplab_node task result: its stdout when it exited 0, else an error
    holding what it printed."""
    if task.get("rc", 1) == 0:
        return task.get("stdout") or ""
    said = f"{task.get('stdout') or ''} {task.get('stderr') or ''}".strip()
    return json.dumps({"error": said or task.get("msg") or f"exit code {task.get('rc')}"})


def cmd_smoke_verdict(args) -> int:
    text = sys.stdin.read()
    try:
        result = json.loads(node_output(json.loads(text)) if args.task_result else text)
    except ValueError:
        raise DdplabError(f"the smoke run printed no JSON on {args.node}: {text.strip()[-300:]!r}") from None
    findings = check(args.code_dir, args.entrypoint)["findings"] if args.code_dir else []
    code, lines = decide(result, args.node, args.entrypoint, findings)
    print("\n".join(lines))
    return code


def add_parser(sub):
    p = sub.add_parser("smoke-verdict", help="decide the launch from the smoke run's JSON (stdin)")
    p.add_argument("--node", required=True, help="the node the smoke run ran on (named in messages)")
    p.add_argument("--code-dir", default="", help="ddplab_code_dir: the scan's hints come from it")
    p.add_argument("--entrypoint", required=True, help='ddplab_entrypoint ("train.py" or "-m pkg.mod")')
    p.add_argument("--task-result", action="store_true",
                   help="stdin is the smoke run's task result (rc, stdout, stderr), not its JSON")
    p.set_defaults(func=cmd_smoke_verdict)
