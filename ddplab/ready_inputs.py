"""The input fingerprint of a launch: what the checks (roles/preflight) and prepare read on the control host.

A node records it when launch.yml's checks pass (nodeprobe/ready.py); the next launch computes it again and
skips the checks and the preparation only when every node recorded this very value and is still as it was
(ddplab/plan.py, after_ready). So anything here that changes makes the launch check (and where a check
fails, prepare) every node again, as a first launch does: every setting but the few that only shape the run
itself (RUN_ONLY), each node's address and connection, the control host's code trees (ddplab's own, yours
and ddplab_sync_dirs, hashed as a sync sends them), the shards' manifest, and ddplab's roles and playbooks
(what prepare does). Too much here costs a check; too little would skip one that was needed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from nodeprobe import hashing

# Settings a launch reads only to start, follow, stop or collect the run: neither the checks nor prepare
# read them, so a relaunch with other steps or another run id does not check the nodes again. ddplab_env
# (the ranks' environment, maybe secrets) stays out of the fingerprint a node keeps, even as a hash.
RUN_ONLY = frozenset({
    "ddplab_run_id", "ddplab_trainer_steps", "ddplab_resume", "ddplab_wait", "ddplab_wait_timeout",
    "ddplab_wait_poll", "ddplab_runs_dir", "ddplab_rdzv_timeout", "ddplab_pg_timeout", "ddplab_max_restarts",
    "ddplab_elastic_restarts", "ddplab_entrypoint_args", "ddplab_collect_globs", "ddplab_log_pattern",
    "ddplab_env",
})
# ddplab's own code trees a sync sends (roles/code_sync) and the Ansible side of prepare.
REPO_TREES = ("trainer", "nodeprobe", "roles", "playbooks", "plugins")


def _tree(path: str) -> str | None:
    return hashing.tree_hash(Path(path)).get("sha256")


def _user_code(settings: dict) -> str | None:
    """Your code as code_sync sends it (gitignore and ddplab_code_include), None without it."""
    if not settings.get("ddplab_code_dir"):
        return None
    from ddplab import code_tree

    tree = code_tree.plan([{"src": settings["ddplab_code_dir"], "dest": settings["ddplab_code_subdir"],
                            "mode": "gitignore", "include": settings["ddplab_code_include"]}])["trees"][0]
    return tree["hash"]


def _manifest(data_dir: str) -> str | None:
    if not data_dir:
        return None
    try:
        return hashing.sha256_file(Path(data_dir).expanduser() / "manifest.json")
    except OSError:
        return None


def fingerprint(hosts: dict[str, dict], connections: dict[str, dict]) -> str:
    """hosts: {node: its resolved settings}; connections: {node: {ansible_host, ansible_connection, ...}}."""
    first = next(iter(hosts.values()))
    repo = first["ddplab_repo_dir"]
    inputs = {
        "settings": {h: {k: v for k, v in s.items() if k not in RUN_ONLY} for h, s in hosts.items()},
        "connections": connections,
        "repo": {tree: _tree(f"{repo}/{tree}") for tree in REPO_TREES},
        "code": _user_code(first),
        "sync": {str(d["dest"]): _tree(str(Path(str(d["src"])).expanduser()))
                 for d in first.get("ddplab_sync_dirs") or []},
        "shards": _manifest(first.get("ddplab_data_dir") or ""),
    }
    hashing.flush_cache()
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()
