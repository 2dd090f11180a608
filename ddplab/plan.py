"""`python -m ddplab plan`: check every setting, then decide which steps of a command run on which hosts.

Every playbook's first play (playbooks/plan.yml, role `plan`) sends the settings as roles/plan collects
them (the input of `python -m ddplab validate`, ddplab/settings/validate.py) plus

    {"command": "launch"}          # the playbook: launch, prepare, preflight, start, status, stop, ...

and gets back the plan, one JSON object the later plays read as the fact `ddplab_plan`:

    {"command": "launch", "run_id": "run-20260101-120000-ab12cd",   # "" = the last run on the master
     "steps": {"preflight": ["node0", "node1"], "prepare": [], "check": [], "start": [...], ...},
     "ask_queue": false, "queue_jobs": [], "say": ["..."]}

A step's list holds the hosts its play runs on; a play whose step lists no host ends at once (one meta task,
nothing printed). The settings are checked first, on the control host only: nothing here connects to a
node, and the one node question a plan may need (Slurm's queue, asked on the master) comes after them.
Bad settings: the validate lines on stderr, exit 2; bad --limit: one line, exit 2.

Later steps of launch.yml change the plan without checking the settings again: {"plan": PLAN, "squeue":
[lines of `squeue --format=%i|%T|%r|%j`], "job_prefix": "ddplab-<lab tag>-"} (ddplab_scheduler slurm: this
lab's queued or running runs, asked on the master once the settings passed) and {"plan": PLAN, "verdict": RC}
(the preflight verdict's exit code: prepare and check again when a check did not pass) and {"plan": PLAN,
"ready": {host: its registered `nodeprobe ready` task}} (each node's answer: did it pass the checks with these
inputs, the plan's "inputs" (ddplab/ready_inputs.py), and is it as it was then; nodeprobe/ready.py).
"""

from __future__ import annotations

import argparse
import json
import secrets
import string

from ddplab import ready_inputs
from ddplab.errors import DdplabError
from ddplab.settings import layout, validate
from ddplab.verb_input import input_text
from trainer.launch_contract import RUN_ID, is_run_id
from trainer.launch_contract import new_run_id as run_id_of_time

# The commands that only watch or stop a run: the control host's inputs (code, shards, torch pin) are not
# checked for them (validate's "inputs": false).
WATCH_ONLY = frozenset({"status", "stop", "collect", "outcome", "wait", "slurm", "tune"})
# Commands that train on every node of the lab: a --limit that leaves one out is refused.
EVERY_NODE = frozenset({"launch", "start"})
COMMANDS = frozenset({"launch", "prepare", "preflight", "validate", *WATCH_ONLY, *EVERY_NODE})
RUN_ID_SUFFIX = 6


def new_run_id(now: float | None = None) -> str:
    """run-YYYYmmdd-HHMMSS-xxxxxx: a random part, so two launches in one second (or a guess from the time)
    never meet."""
    tail = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(RUN_ID_SUFFIX))
    return f"{run_id_of_time(now)}-{tail}"


def lab_jobs(squeue: list[str], job_prefix: str) -> list[str]:
    """The lines of `squeue --format=%i|%T|%r|%j` whose job name (the last field) is one of this lab's."""
    return [line for line in squeue if line.rsplit("|", 1)[-1].startswith(job_prefix)]


def left_out(inv: dict, settings: dict, command: str) -> None:
    """Refuse a --limit that leaves out nodes of a run (start.yml --limit NODE -e ddplab_run_id=RUN takes a
    node back into a running ddplab_elastic run)."""
    nodes = inv["groups"][layout.NODES]
    missing = [h for h in nodes if h not in inv.get("play_hosts", nodes)]
    rejoin = command == "start" and settings["ddplab_elastic"] and settings["ddplab_run_id"]
    if missing and not rejoin:
        raise DdplabError(
            f"--limit leaves out {', '.join(missing)}: a run trains on every node of the lab "
            f"({', '.join(nodes)}). Run launch.yml without --limit, or take the node out of the inventory; "
            "prepare.yml, preflight.yml, status.yml, collect_logs.yml and stop.yml accept --limit (and "
            "start.yml --limit NODE -e ddplab_run_id=RUN takes a node back into a running ddplab_elastic "
            "run).")


def run_id(settings: dict, command: str, now: float | None = None) -> str:
    """The given id; for launch and start a new one when none is given; "" = the master's last run."""
    given = settings["ddplab_run_id"]
    if given:
        if not is_run_id(given):
            raise DdplabError(f"run id {given!r} is not usable as a tmux session and folder name; use "
                              "letters, digits, '.', '_' and '-' only (for example -e ddplab_run_id=run-1).")
        return given
    return new_run_id(now) if command in EVERY_NODE else ""


def launch_steps(hosts: list[str], settings: dict) -> dict:
    """launch.yml's steps before any node is asked: prepare runs at once only for a requirements file (prepare
    installs it; preflight does not check it) or ddplab_prepare_always, else where the preflight fails
    (`prepare_on_fail`, applied by after_verdict)."""
    waits = hosts if settings["ddplab_wait"] else []
    prepare = hosts if settings["ddplab_pip_requirements"] or settings["ddplab_prepare_always"] else []
    return {"preflight": hosts, "prepare": prepare, "check": prepare, "prepare_on_fail": hosts,
            "start": hosts, "collect": waits}


def after_queue(plan: dict, squeue: list[str], job_prefix: str) -> dict:
    """ddplab_scheduler slurm: a queued or running run of this lab keeps its nodes as they are (its ports and
    processes are in use, its code and shards must not change under it): no checks, no preparation; the run is
    submitted behind it."""
    jobs = lab_jobs(squeue, job_prefix)
    steps = dict(plan["steps"])
    say = list(plan["say"])
    if jobs:
        steps.update(preflight=[], prepare=[], check=[], prepare_on_fail=[])
        say.append(f"Slurm runs of this lab queued or running ({'; '.join(jobs)}): this run is submitted "
                   "behind them; the nodes are neither checked nor prepared now.")
    return {**plan, "ask_queue": False, "queue_jobs": jobs, "say": say, "steps": steps}


def after_ready(plan: dict, ready: dict) -> dict:
    """launch.yml on a lab whose every node passed the checks with these inputs and is as it was then
    (nodeprobe/ready.py): no checks, no preparation. Any node that is not (or did not answer): as before,
    every node is checked and prepared where a check fails (the links between nodes are checked together)."""
    hosts = plan["steps"]["preflight"]
    answers = {h: last_json((ready.get(h) or {}).get("stdout") or "") for h in hosts}
    if not hosts or not all(a.get("ready") is True for a in answers.values()):
        return {**plan, "ask_ready": False}
    steps = {**plan["steps"], "preflight": [], "prepare": [], "check": [], "prepare_on_fail": []}
    return {**plan, "ask_ready": False, "steps": steps}


def last_json(text: str) -> dict:
    """The last line of `text` that is a JSON object, {} when there is none."""
    for line in reversed(text.splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return {}


def after_verdict(plan: dict, verdict: int) -> dict:
    """The preflight's verdict (its exit code, 0 = every check passed): prepare, and check again, every node
    when a check did not pass."""
    steps = dict(plan["steps"])
    if verdict != 0:
        steps.update(prepare=steps["prepare_on_fail"], check=steps["prepare_on_fail"])
    return {**plan, "steps": steps}


def decide(inv: dict, command: str, now: float | None = None) -> dict:
    """The plan of `command` for the inventory `inv` (validate's input, already checked)."""
    if command not in COMMANDS:
        raise DdplabError(f"plan: command {command!r} is not one of {', '.join(sorted(COMMANDS))}")
    inv = validate.from_columns(inv)
    nodes = inv["groups"][layout.NODES]
    hosts = [h for h in nodes if h in inv.get("play_hosts", nodes)]
    first = next(h for h in nodes if not (inv["hosts"].get(h) or {}).get("partial"))
    given = (inv["hosts"][first] or {}).get("vars") or {}
    settings, _ = validate.resolve(given, inv.get("playbook_dir") or "")
    if command in EVERY_NODE:
        left_out(inv, settings, command)
    launch = command == "launch"
    steps = launch_steps(hosts, settings) if launch else {command: hosts}
    # launch.yml asks the nodes whether they passed the checks with these inputs, unless it prepares anyway;
    # not under Slurm, whose daemons' state (the checks' slurm row) no record of the node can vouch for
    ask_ready = launch and not steps["prepare"] and settings["ddplab_scheduler"] != "slurm"
    return {"command": command, "run_id": run_id(settings, command, now), "run_id_pattern": f"^{RUN_ID}$",
            "ask_queue": launch and settings["ddplab_scheduler"] == "slurm", "queue_jobs": [], "say": [],
            "ask_ready": ask_ready, "inputs": launch_inputs(inv, nodes) if launch else "", "steps": steps}


def launch_inputs(inv: dict, nodes: list[str]) -> str:
    """The launch's input fingerprint (ddplab/ready_inputs.py) from every node's settings and connection."""
    resolved, connections = {}, {}
    for h in nodes:
        host = inv["hosts"].get(h) or {}
        resolved[h], _ = validate.resolve(host.get("vars") or {}, inv.get("playbook_dir") or "")
        connections[h] = {k: host.get(k) for k in ("ansible_host", "ansible_connection")}
    return ready_inputs.fingerprint(resolved, connections)


def run(args) -> int:
    text = input_text(args.input)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise DdplabError(f"plan input ({args.input}) is not JSON ({e}); see python -m ddplab plan --help") \
            from None
    if "plan" in data:  # a step of a plan already decided: its settings were checked then
        plan = data["plan"]
        if "squeue" in data:
            plan = after_queue(plan, data["squeue"], data.get("job_prefix", ""))
        if "ready" in data:
            plan = after_ready(plan, data["ready"])
        if "verdict" in data:
            plan = after_verdict(plan, int(data["verdict"]))
    else:
        command = data.get("command", "validate")
        inv = {**data, "inputs": command not in WATCH_ONLY and data.get("inputs", True)}
        if validate.report(validate.validate(inv, network=not args.offline),
                           inv.get("groups", {}).get(layout.NODES) or []):
            return 2
        plan = decide(inv, command)
    print(json.dumps(plan))
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="check every setting, then decide which steps run where (JSON on stdin)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default="-", help="JSON file (default: stdin)")
    p.add_argument("--offline", action="store_true", help="do not ask the package index about the torch pin")
    p.set_defaults(func=run)
