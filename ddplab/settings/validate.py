"""`python -m ddplab validate`: every ddplab_* setting of every node checked before a node is touched.

Input (JSON on stdin, written by roles/plan; usable by hand too):

    {"playbook_dir": "/path/ddplab/playbooks",
     "groups": {"ddplab_nodes": [...], "ddplab_master": [...], "ddplab_workers": [...]},
     "play_hosts": [...],                       # the hosts the play runs on (--limit), optional
     "hosts": {"node0": {"vars": {"ddplab_node_rank": 0, ...},   # ddplab_* as inventory and -e give them
                         "ansible_host": "10.0.0.5", "ansible_connection": "ssh"}}}

(roles/plan sends the same as columns: "given", "node_rank", "addr", "ansible_host",
"ansible_connection", each host -> value; see from_columns.)

A name missing from "vars" takes its default from the spec. Output: one line per problem on stderr,
`ddplab: error: <setting or file> (<host or all>): <found>; <allowed>; <fix>`; exit 2 when any is an
error, else 0 (warnings only).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import re
import sys

from ddplab.settings import external, inputs, layout
from ddplab.settings.problems import Problem, merge
from ddplab.settings.spec import BY_NAME, HOST, INTERNAL, SETTINGS
from ddplab.settings.values import coerce, shown
from ddplab.verb_input import input_text

SETTINGS_DOC = "the settings documented in inventory/example/group_vars/all/"


JINJA = re.compile(r"\{\{\s*(\w+)\s*(\|\s*dirname\s*)?\}\}")


def _render(template: str, context: dict) -> str:
    """The spec's Jinja defaults, which use only `{{ name }}` and `{{ name | dirname }}` (no jinja2 import:
    this runs before every playbook)."""

    def one(m):
        value = str(context[m[1]])
        return os.path.dirname(value) if m[2] else value

    out = JINJA.sub(one, template)
    if "{{" in out or "{%" in out:
        raise ValueError(f"the spec's default {template!r} uses more Jinja than name and | dirname")
    return out


def resolve(given: dict, playbook_dir: str, host_only: bool = False) -> tuple[dict, list[Problem]]:
    """Typed values of every setting for one host (defaults filled in), and the problems found.
    host_only: only the host settings given (a host outside the play, whose settings were not collected)."""
    values: dict = {}
    problems = []
    for s in SETTINGS:
        if (s.section == HOST or host_only) and s.name not in given:
            continue
        raw = given.get(s.name, s.default)
        if s.name not in given and s.jinja:
            raw = _render(s.default, {"playbook_dir": playbook_dir, **values})
        typed, problem = coerce(s, raw)
        if problem:
            problems.append(problem)
        else:
            values[s.name] = typed
    return values, problems


def closest(name: str) -> str | None:
    """The known setting a typo most likely meant, compared without the common `ddplab_` prefix."""
    known = {s.name.removeprefix("ddplab_"): s.name for s in SETTINGS}
    typed = name.removeprefix("ddplab_")
    close = difflib.get_close_matches(typed, list(known), n=1, cutoff=0.6)
    if close:
        return known[close[0]]
    within = sorted((k for k in known if typed and (typed in k or k in typed)), key=len)
    return known[within[0]] if within else None


def unknown(names: dict[str, list[str]], strict: bool) -> list[Problem]:
    """names: each ddplab_* name given -> the hosts that have it."""
    out = []
    for name in sorted(set(names) - set(BY_NAME) - INTERNAL):
        close = closest(name)
        hint = f"did you mean {close}?" if close else "remove it, or check the spelling"
        out.append(Problem(name, f"{name} is not a ddplab setting", SETTINGS_DOC, hint, hosts=names[name],
                           level="error" if strict else "warning"))
    return out


def _consistency(values: dict[str, dict]) -> list[Problem]:
    """Run-wide settings must have one value on every node."""
    out = []
    for s in SETTINGS:
        if s.per_host:
            continue
        seen = {h: v[s.name] for h, v in values.items() if s.name in v}
        if len({json.dumps(x, sort_keys=True) for x in seen.values()}) > 1:
            found = ", ".join(f"{h}={json.dumps(x)}" for h, x in seen.items())
            out.append(Problem(s.name, f"differs between hosts ({found})", "one value for the whole run",
                               f"set {s.name} once, in group_vars/all/ or with -e", hosts=[]))
    return out


# Run-wide checks and the settings each reads: a check runs only when all of them are well typed.
# The control host's inputs (code, shards, trainer flags, the torch pin) are checked only for the
# playbooks that use them ("inputs": true, the default); status, stop, collect_logs and wait only watch
# a run and must work without the shards on this host.
INPUT_CHECKS = ("code", "shards", "trainer_args", "sync_dirs")
RUN_CHECKS = (
    (inputs.relations, ("ddplab_code_dir", "ddplab_entrypoint", "ddplab_data_dir",
                        "ddplab_pip_requirements", "ddplab_entrypoint_args")),
    (inputs.folders, ("ddplab_repo_dir", "ddplab_runs_dir")),
    (inputs.code, ("ddplab_code_dir", "ddplab_entrypoint", "ddplab_pip_requirements", "ddplab_code_include")),
    (inputs.shards, ("ddplab_data_dir", "ddplab_entrypoint")),
    (inputs.sync_dirs, ("ddplab_sync_dirs",)),
    (inputs.log_pattern, ("ddplab_log_pattern", "ddplab_entrypoint")),
    (inputs.scheduler, ("ddplab_scheduler", "ddplab_elastic", "ddplab_srun_ports")),
    (external.trainer_args, ("ddplab_entrypoint", "ddplab_data_dir", "ddplab_run_id", "ddplab_trainer_steps",
                             "ddplab_trainer_depth", "ddplab_pg_timeout", "ddplab_resume",
                             "ddplab_trainer_extra_args", "ddplab_threads", "ddplab_balance",
                             "ddplab_elastic", "ddplab_shard")),
)


def from_columns(inv: dict) -> dict:
    """The role's input (one mapping per column, host -> value) in the per-host form above. A host outside
    the play (--limit) has no collected settings: its rank and address from hostvars stand in."""
    if "given" not in inv:
        return inv
    hosts = {}
    for h, given in inv["given"].items():
        partial = given is None
        if partial:
            columns = (("ddplab_node_rank", "node_rank"), ("ddplab_addr", "addr"))
            given = {k: inv[col][h] for k, col in columns if inv.get(col, {}).get(h) is not None}
        hosts[h] = {"vars": given, "ansible_host": inv.get("ansible_host", {}).get(h),
                    "ansible_connection": inv.get("ansible_connection", {}).get(h), "partial": partial}
    return {**inv, "hosts": hosts}


def validate(inv: dict, *, network: bool = True) -> list[Problem]:
    """Every problem of the inventory and its settings (unmerged)."""
    inv = from_columns(inv)
    problems = layout.groups(inv)
    nodes = inv.get("groups", {}).get(layout.NODES) or []
    hosts = inv.get("hosts", {})
    if not nodes:
        return problems
    playbook_dir = inv.get("playbook_dir") or os.path.join(os.getcwd(), "playbooks")
    values: dict[str, dict] = {}
    bad: set[str] = set()
    names: dict[str, list[str]] = {}
    for h in nodes:
        given = (hosts.get(h) or {}).get("vars") or {}
        for n in given:
            if n.startswith("ddplab_"):
                names.setdefault(n, []).append(h)
        values[h], found = resolve(given, playbook_dir, host_only=(hosts.get(h) or {}).get("partial", False))
        for p in found:
            p.hosts = [h]
            bad.add(p.subject)
        problems += found
    full = [h for h in nodes if not (hosts.get(h) or {}).get("partial")]
    if not full:
        return problems
    first = values[full[0]]
    problems += unknown(names, first.get("ddplab_strict", True))
    problems += _consistency(values)
    check_inputs = str(inv.get("inputs", True)).strip().lower() not in ("false", "no", "0")
    for check, needs in RUN_CHECKS:
        if not bad.intersection(needs) and (check_inputs or check.__name__ not in INPUT_CHECKS):
            problems += check(first)
    if check_inputs and network and not bad.intersection(("ddplab_torch_version", "ddplab_pip_index_url",
                                         "ddplab_pip_find_links")):
        problems += external.torch_pin(first)
    for h in nodes:
        if "ddplab_env" in values[h]:
            problems += inputs.env(values[h], h)
    if not bad.intersection(("ddplab_slurm_nodes", "ddplab_scheduler")):
        problems += inputs.slurm_nodes(first, len(nodes))
    masters = inv["groups"].get(layout.MASTER) or []
    if len(masters) == 1 and masters[0] in values and "ddplab_node_rank" not in bad:
        problems += layout.ranks(nodes, masters[0], {h: values[h].get("ddplab_node_rank") for h in nodes})
    addrs = {}
    for h in nodes:
        info = hosts.get(h) or {}
        if "ddplab_addr" in bad and "ddplab_addr" in (info.get("vars") or {}):
            continue
        addrs[h] = {"addr": values[h].get("ddplab_addr") or info.get("ansible_host") or h,
                    "connection": info.get("ansible_connection") or "ssh"}
    problems += layout.addresses(addrs)
    return problems


def report(problems: list[Problem], nodes: list[str], stream=sys.stderr) -> int:
    merged = merge(problems)
    for p in sorted(merged, key=lambda p: p.level != "error"):
        print(p.line(nodes), file=stream)
    return 2 if any(p.level == "error" for p in merged) else 0


def run(args) -> int:
    text = input_text(args.input)
    try:
        inv = json.loads(text)
    except ValueError as e:
        print(f"ddplab: error: validate input ({args.input}): {shown(text[:40])} is not JSON ({e}); "
              "a JSON object; see `python -m ddplab validate --help`", file=sys.stderr)
        return 2
    return report(validate(inv, network=not args.offline), inv.get("groups", {}).get(layout.NODES) or [])


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check every ddplab_* setting of an inventory (JSON on stdin)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default="-", help="JSON file (default: stdin)")
    p.add_argument("--offline", action="store_true", help="do not ask the package index about the torch pin")
    p.set_defaults(func=run)
