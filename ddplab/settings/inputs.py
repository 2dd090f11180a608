"""Checks of the control host's inputs named by settings: folders, the entry point, the shards' manifest.

Each function takes the resolved settings of the run and returns Problems naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from ddplab import code_tree
from ddplab.errors import DdplabError
from ddplab.settings.problems import CONTROL, Problem
from nodeprobe import hashing, log_metrics

# Shard sets up to this size are hashed here (the default set is ~400 kB); larger ones are checked for
# presence only, and their sha256 is verified on every node by the dataset role.
HASH_BUDGET_BYTES = 256 << 20
MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ENV_RESERVED = re.compile(r"DDPLAB_.*|MASTER_ADDR|MASTER_PORT|NODE_RANK|NNODES|NPROC_PER_NODE|PYTHONPATH")
# The lab's own node paths (relative to ddplab_root) that a sync dir must not be, or be inside of.
LAB_OWN = ("code", "venv", "runs")
LAB_OWN_EXACT = ("data", "python", "last_run", "tmux.sock")
REGEN = "regenerate it with `make data` (or python -m trainer.data prepare --out DIR)"


def _p(subject, found, allowed, fix):
    return Problem(subject, found, allowed, fix, hosts=[])


def relations(v: dict) -> list[Problem]:
    out = []
    code, entry = v["ddplab_code_dir"], v["ddplab_entrypoint"]
    if bool(code) != bool(entry):
        name = "ddplab_entrypoint" if code else "ddplab_code_dir"
        other = "ddplab_code_dir" if name == "ddplab_entrypoint" else "ddplab_entrypoint"
        out.append(_p(name, f"{json.dumps(v[name])} while {other} is {json.dumps(v[other])}",
                      "both set (your own code) or both empty (the built-in trainer)",
                      "set both, e.g. ddplab_entrypoint=train.py or \"-m scripts.base_train\", or neither"))
    if not v["ddplab_data_dir"] and not entry:
        out.append(_p("ddplab_data_dir", "\"\" (an empty string) with the built-in trainer",
                      "a shard folder: the built-in trainer trains on parquet shards",
                      "set it to a shard folder (`make data` writes data/shards), or bring your own code "
                      "(ddplab_code_dir and ddplab_entrypoint)"))
    if v["ddplab_pip_requirements"] and not code:
        out.append(_p("ddplab_pip_requirements", json.dumps(v["ddplab_pip_requirements"]) + " without "
                      "ddplab_code_dir", "a file inside ddplab_code_dir",
                      "set ddplab_code_dir, or leave ddplab_pip_requirements empty"))
    if v["ddplab_entrypoint_args"] and not entry:
        out.append(_p("ddplab_entrypoint_args", json.dumps(v["ddplab_entrypoint_args"]) + " with the "
                      "built-in trainer", "arguments of your own entry point",
                      "pass the built-in trainer's flags in ddplab_trainer_extra_args instead"))
    return out


def _is_dir(name: str, path: str, fix: str) -> list[Problem]:
    if os.path.isdir(path):
        return []
    found = f"{path} is a file" if os.path.exists(path) else f"{path} does not exist"
    return [_p(name, found, "a folder on the control host", fix)]


def folders(v: dict) -> list[Problem]:
    out = _is_dir("ddplab_repo_dir", v["ddplab_repo_dir"],
                  "point it at the ddplab checkout (or leave it unset)")
    runs = v["ddplab_runs_dir"]
    if os.path.exists(runs) and not os.path.isdir(runs):
        out.append(_p("ddplab_runs_dir", f"{runs} is a file", "a folder (created when missing)",
                      "point it at a folder"))
    return out


def code(v: dict) -> list[Problem]:
    root, entry, req = v["ddplab_code_dir"], v["ddplab_entrypoint"].strip(), v["ddplab_pip_requirements"]
    if not root:
        return []
    out = _is_dir("ddplab_code_dir", root, "set it to the folder of your training code on the control host")
    if out:
        return out
    if not entry:
        pass  # relations() reports the missing entry point
    elif entry.startswith("-m"):
        module = entry[2:].strip()
        if not MODULE.fullmatch(module):
            out.append(_p("ddplab_entrypoint", json.dumps(entry),
                          "\"-m package.module\" with a dotted module name, or a script path",
                          "fix the module name, e.g. \"-m scripts.base_train\""))
    else:
        out += _inside("ddplab_entrypoint", root, entry, "a script file relative to ddplab_code_dir",
                       "fix the path, or use \"-m package.module\"")
    if req:
        out += _inside("ddplab_pip_requirements", root, req, "a file relative to ddplab_code_dir",
                       "fix the path (relative to ddplab_code_dir), or set it to \"\"")
    return out + _links_out("ddplab_code_dir", root, "gitignore", v["ddplab_code_include"])


def _links_out(name: str, src: str, mode: str, include: list[str]) -> list[Problem]:
    """A file the sync of src would send whose realpath is outside src (ddplab/code_tree.py refuses it too,
    but this check runs before any node changes)."""
    try:
        rels = code_tree.planned_files(src, mode, include)[0]
    except DdplabError:
        return []  # a bad ddplab_code_include glob: the plan names it
    bad = code_tree.outside(src, rels)
    return [_p(name, *code_tree.outside_message(src, bad))] if bad else []


def _inside(name: str, root: str, rel: str, allowed: str, fix: str) -> list[Problem]:
    path = os.path.normpath(os.path.join(root, rel))
    if os.path.isabs(rel) or not path.startswith(os.path.normpath(root) + os.sep):
        return [_p(name, f"{json.dumps(rel)} is outside ddplab_code_dir", allowed, fix)]
    if not os.path.isfile(path):
        return [_p(name, f"{json.dumps(rel)}: {path} does not exist", allowed, fix)]
    return []


def env(v: dict, host: str) -> list[Problem]:
    names = list(v["ddplab_env"])
    bad = [n for n in names if not ENV_NAME.fullmatch(n)]
    reserved = [n for n in names if ENV_NAME.fullmatch(n) and ENV_RESERVED.fullmatch(n)]
    out = []
    if bad or reserved:
        out.append(Problem("ddplab_env", "names " + json.dumps(bad + reserved),
                           "shell variable names other than DDPLAB_*, MASTER_ADDR, MASTER_PORT, NODE_RANK, "
                           "NNODES, NPROC_PER_NODE and PYTHONPATH (ddplab sets those)",
                           "rename or remove those variables", hosts=[host]))
    return out


def log_pattern(v: dict) -> list[Problem]:
    """ddplab_log_pattern compiles and names only the groups nodeprobe/log_metrics.py reads."""
    text = v["ddplab_log_pattern"]
    if not text:
        return []
    if not v["ddplab_entrypoint"]:
        return [_p("ddplab_log_pattern", f"{json.dumps(text)} with the built-in trainer",
                   "a regex for the lines of your own entry point (the built-in trainer writes its metrics)",
                   "remove ddplab_log_pattern, or set ddplab_code_dir and ddplab_entrypoint")]
    try:
        log_metrics.custom_format(text)
    except log_metrics.PatternError as e:
        return [_p("ddplab_log_pattern", f"{json.dumps(text)} {e}",
                   "a Python regex with a step group and others among " + ", ".join(log_metrics.FIELDS),
                   "fix the regex, e.g. ^step (?P<step>\\d+) loss (?P<loss>\\S+), or set it to \"\" for "
                   "nanoGPT's and nanochat's lines")]
    return []


def sync_dirs(v: dict) -> list[Problem]:
    """ddplab_sync_dirs: each src an existing folder here, each dest a node path that stays where it says
    (absolute, or inside ddplab_root without `..`), away from the lab's own folders and the other dests."""
    out, seen = [], []
    name = "ddplab_sync_dirs"
    allowed = ("src: an existing folder on the control host; dest: an absolute node path or one relative to "
               "ddplab_root, without '..', outside its code/, venv/, runs/ and other dests")
    for entry in v["ddplab_sync_dirs"]:
        src, dest = entry["src"], entry["dest"]
        shown = json.dumps(entry)
        path = os.path.expanduser(src)
        if not os.path.isdir(path):
            what = "is a file" if os.path.exists(path) else "does not exist"
            out.append(_p(name, f"{shown}: src {path} {what} on the control host", allowed,
                          "point src at the data folder on this host (prepare it first)"))
        else:
            out += _links_out(name, path, "all", [])
        parts = dest.replace("\\", "/").split("/")
        norm = os.path.normpath(dest) if dest else ""
        rel = not dest.startswith("/")
        if ".." in parts or dest.startswith("~") or norm in ("", ".", "/") \
                or (rel and (parts[0] in LAB_OWN or norm in LAB_OWN_EXACT)):
            out.append(_p(name, f"{shown}: dest {json.dumps(dest)} is not a folder of its own on the node",
                          allowed, 'use e.g. "data/owt" (under ddplab_root) or "/srv/data/owt"'))
            continue
        key = norm if not rel else "@root/" + norm
        if any(key == o or key.startswith(o + "/") or o.startswith(key + "/") for o in seen):
            out.append(_p(name, f"{shown}: dest {json.dumps(dest)} overlaps another entry's dest", allowed,
                          "give each entry its own folder, none inside another"))
        seen.append(key)
    return out


def shards(v: dict) -> list[Problem]:
    """The control host's shard folder and its manifest.json: present, JSON, safe names, matching files."""
    data = v["ddplab_data_dir"]
    if not data:
        return []
    fix = "make the shards (`make data` writes data/shards) or set ddplab_data_dir to your shard folder"
    if v["ddplab_entrypoint"]:
        fix += " (\"\" when your code brings its own data)"
    found = _is_dir("ddplab_data_dir", data, fix)
    if found:
        return found
    path = Path(data) / "manifest.json"
    if not path.is_file():
        return [Problem(str(path), "missing", "a shard folder made by python -m trainer.data prepare",
                        REGEN + ", or set ddplab_data_dir", hosts=[CONTROL])]
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return [Problem(str(path), f"not JSON ({e})", "the JSON manifest that trainer.data prepare writes",
                        REGEN, hosts=[CONTROL])]
    try:
        listed = hashing.manifest_files(manifest)
    except ValueError as e:
        return [Problem(str(path), str(e), "a 'files' list of {file, sha256}", REGEN, hosts=[CONTROL])]
    unsafe = [f for f in listed if "/" in f or "\\" in f or f in ("", ".", "..") or ".." in f.split("/")]
    if not listed or unsafe:
        found = f"unsafe file names {json.dumps(unsafe)}" if unsafe else "no files listed"
        return [Problem(str(path), found, "plain file names inside the shard folder (no '/' or '..')",
                        REGEN, hosts=[CONTROL])]
    if manifest.get("digest") != hashing.set_digest(listed):
        digest = str(manifest.get("digest"))[:16]
        return [Problem(str(path), f"digest {digest}... does not match its files list",
                        "the digest of the listed files (docs/contracts.md)", REGEN, hosts=[CONTROL])]
    missing = [f for f in sorted(listed) if not (Path(data) / f).is_file()]
    if missing:
        return [Problem(str(path), f"lists files missing from {data}: {', '.join(missing[:5])}",
                        "every listed shard present", REGEN, hosts=[CONTROL])]
    size = sum((Path(data) / f).stat().st_size for f in listed)
    if size <= HASH_BUDGET_BYTES:
        actual = {f: hashing.sha256_file(Path(data) / f) for f in listed}
        diff = hashing.compare(actual, listed)
        if diff["changed"]:
            changed = ", ".join(diff["changed"][:5])
            return [Problem(str(path), f"sha256 of {changed} differs from the manifest",
                            "shards whose sha256 matches manifest.json", REGEN, hosts=[CONTROL])]
    return []


def slurm_nodes(v: dict, lab_nodes: int) -> list[Problem]:
    """ddplab_slurm_nodes: a part of the lab, for a Slurm run only."""
    n = v["ddplab_slurm_nodes"]
    if n == 0:
        return []
    if v["ddplab_scheduler"] != "slurm":
        return [_p("ddplab_slurm_nodes", f"{n} with ddplab_scheduler {v['ddplab_scheduler']}",
                   "0 (every node) unless ddplab_scheduler is slurm: a tmux run trains on every node",
                   "set ddplab_slurm_nodes: 0, or ddplab_scheduler: slurm")]
    if n > lab_nodes:
        return [_p("ddplab_slurm_nodes", f"{n} but the lab has {lab_nodes} nodes",
                   f"1..{lab_nodes} (0: every node)", f"set ddplab_slurm_nodes to {lab_nodes} or fewer")]
    return []


def scheduler(v: dict) -> list[Problem]:
    """What a Slurm run cannot do, refused before any node is touched."""
    if v["ddplab_scheduler"] != "slurm":
        return []
    out = []
    if v["ddplab_elastic"]:
        out.append(_p("ddplab_elastic", "true with ddplab_scheduler slurm",
                      "false: a Slurm job has a fixed node list, and Slurm (not torchrun's elastic agent) "
                      "decides what happens when a node fails",
                      "set ddplab_elastic: false, or ddplab_scheduler: none for an elastic run"))
    first, _, last = v["ddplab_srun_ports"].partition("-")
    if first and last and not 1024 <= int(first) <= int(last) <= 65535:
        out.append(_p("ddplab_srun_ports", json.dumps(v["ddplab_srun_ports"]),
                      "FIRST-LAST with 1024 <= FIRST <= LAST <= 65535",
                      "set e.g. ddplab_srun_ports: \"60001-60100\""))
    return out
