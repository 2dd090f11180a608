"""The preflight role's data across hosts (vars/main.yml only names them):

    {{ hosts | per_host(hostvars, 'preflight_gather') }}          -> {host: its registered result}
    {{ hosts | per_host(hostvars, 'preflight_gather.stdout', '') }} -> {host: one field of it, or the default}
    {{ left_out | ssh_targets(hostvars) }}  -> ["name=ssh_addr:ssh_port", ...] of the nodes reached over SSH
    {{ connect_result | silent_targets }}   -> the names `nodeprobe connect` could not reach
    {{ loop_results | by_item }}            -> {item: its result} of a loop's registered results
    {{ loop_results | by_item('stdout') }}  -> {item: its stdout}, for the results that have one
    {{ python | verdict_argv(settings) }}   -> `python -m ddplab preflight-verdict`'s command line
"""

from __future__ import annotations

import json

MISSING = object()


def _field(hv, path: str, default):
    value = hv
    for key in path.split("."):
        try:
            value = value[key]
        except (KeyError, TypeError):
            return default
    return value


def per_host(hosts: list[str], hostvars, path: str, default=MISSING) -> dict:
    """{host: hostvars[host].<path>}; a host without it gets `default` (with no default: left out)."""
    out = {}
    for host in hosts:
        value = _field(hostvars[host], path, default)
        if value is not MISSING:
            out[host] = value
    return out


def ssh_targets(left_out: list[str], hostvars) -> list[str]:
    """The left-out nodes reached over SSH (not `local`), as `nodeprobe connect` targets. The control host
    tries their SSH port first: a delegated task to a node that does not answer ends the play at once
    (Ansible ignores ignore_unreachable there, ansible/ansible#35030)."""
    out = []
    for host in left_out:
        hv = hostvars[host]
        if hv.get("ansible_connection") == "local":
            continue
        out.append(f"{host}={hv.get('ansible_host') or host}:{hv.get('ansible_port') or 22}")
    return out


def silent_targets(result) -> list[str]:
    """The targets of a registered `nodeprobe connect` (its last JSON line) that did not answer."""
    lines = (result or {}).get("stdout_lines") or []
    try:
        targets = json.loads(lines[-1]).get("targets") or {} if lines else {}
    except (ValueError, AttributeError):
        return []
    return [name for name, target in targets.items() if not (target or {}).get("ok")]


def by_item(results: list[dict], field: str | None = None) -> dict:
    """{item: result}, or {item: result[field]} of the results that have it (an unreachable one has no
    stdout)."""
    if field is None:
        return {r["item"]: r for r in results or []}
    return {r["item"]: r[field] for r in results or [] if field in r}


def verdict_argv(python: str, s: dict) -> list[str]:
    """The verdict's command line on the control host (without --gate/--out), from the role's settings `s`:
    data_dir, code_subdir, code_dir, dump_dir ("" = no dump), repo_dir, code_trees (compared with the nodes'),
    code_include, sync_dirs."""
    return ([python, "-m", "ddplab", "preflight-verdict", f"--data-dir={s['data_dir']}",
             f"--code-tree={s['code_subdir']}={s['code_dir']}", f"--dump={s['dump_dir']}"]
            + [f"--code={s['repo_dir']}/{tree}" for tree in s["code_trees"]]
            + [f"--code-include={pattern}" for pattern in s["code_include"]]
            + [f"--sync-dir={json.dumps(d)}" for d in s["sync_dirs"]])


class FilterModule:
    def filters(self):
        return {"per_host": per_host, "ssh_targets": ssh_targets, "silent_targets": silent_targets,
                "by_item": by_item, "verdict_argv": verdict_argv}
