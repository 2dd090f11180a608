"""``python -m ddplab preflight-verdict``: the nodes' probe results in, host x check table and JSON out.

    python -m ddplab preflight-verdict < bundle.json --out runs/preflight/latest.json \
        [--data-dir D | --manifest M] [--code DIR ...] [--code-tree NAME=SRC] [--gate] [--dump DIR]
    python -m ddplab preflight-verdict --in DIR ...     # judge a dump folder again

The bundle (stdin, format in ddplab/preflight/collect.py) is the preflight role's registered Ansible
results, judged in memory; ``--dump DIR`` also writes them as a folder (``preflight_debug_dump``).
``--gate`` only prints whether the gloo smoke test may run (``{"smoke": false, "reason": ...}`` when
a check it needs already failed) and hashes no control-side code (the code check does not gate it).

Each check of each host gets status ok / FAIL / skip (not run) / n/a, a detail and the command that
fixes it. Exit 0 when every check passed, 1 on any FAIL (or when checks were not run), 2 on bad input.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

from ddplab.errors import DdplabError
from ddplab.preflight import (
    checks_files,
    checks_inventory,
    checks_link,
    checks_network,
    checks_node,
    checks_slurm,
    collect,
)
from ddplab.preflight.collect import InputError
from ddplab.preflight.judge import CHECKS, FAIL, NA, SKIP, Judge, fold_unprepared
from nodeprobe import hashing
from nodeprobe.place_files import write_file

# Checks a failure of which makes the gloo smoke test pointless (or a sure hang): --gate skips it.
SMOKE_NEEDS = ("inventory", "ssh", "torch", "gloo", "iface", "hostname", "tcp_master", "tcp_peers",
               "master_port", "stale_processes")
# Per reachable host, in this order (the smoke check reads the others' failures, so it comes last).
HOST_CHECKS = (checks_node.python, checks_node.torch, checks_node.dtype, checks_node.threads,
               checks_node.cpu_power, checks_node.memory, checks_node.disk, checks_files.code,
               checks_files.data, checks_files.sync_dirs, checks_network.iface,
               checks_network.hostname, checks_network.master_port, checks_network.firewall,
               checks_network.stale, checks_slurm.slurm)


def judge(j: Judge) -> dict:
    checks_inventory.inventory(j)
    for h in j.hosts:
        if h in j.left_out:  # --limit: a row that says so; only its links with the chosen nodes are checked
            for c in CHECKS:
                j.set(h, c, NA, "not asked (left out by --limit)")
            checks_inventory.left_out_ssh(j, h)
            continue
        checks_inventory.ssh(j, h)
    for h in j.hosts:
        if h in j.left_out:
            continue
        if not j.reachable(h):
            for c in CHECKS[2:]:
                j.set(h, c, SKIP, "host unreachable over SSH")
            continue
        for check in HOST_CHECKS:
            check(j, h)
    checks_network.tcp(j)
    for h in j.hosts:
        if h in j.left_out:
            continue
        if j.reachable(h):
            checks_network.smoke(j, h)
            checks_link.link(j, h)
        if "gloo" not in j.rows[h]:
            j.set(h, "gloo", SKIP, "no fingerprint")
    unprepared = fold_unprepared(j)
    failures = [{"host": h, "check": c, **j.rows[h][c]} for h in j.hosts for c in CHECKS
                if j.rows[h][c]["status"] == FAIL]
    skipped = [(h, c) for h in j.hosts for c in CHECKS if j.rows[h][c]["status"] == SKIP]
    bandwidth = (j.probe(j.master, "gloo_smoke") or {}).get("bandwidth") if j.master else None
    return {
        "version": 1,
        "ok": not failures and not skipped,
        "generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "master": j.master,
        "master_port": j.port,
        "checks": list(CHECKS),
        "hosts": {h: {c: j.rows[h][c] for c in CHECKS} for h in j.hosts},
        "failures": failures,
        "not_run": [f"{h}:{c}" for h, c in skipped],
        "unprepared": unprepared,
        "bandwidth": bandwidth or None,
        "left_out": list(j.left_out),
        # --limit: were the links between the chosen nodes and the left-out ones tried (preflight-outside)?
        "left_out_links": any(j.probe(h, "ssh") for h in j.left_out),
    }


def table(result: dict) -> str:
    hosts = list(result["hosts"])
    width = max(len("check"), *(len(c) for c in CHECKS))
    cols = [max(6, len(h)) for h in hosts]
    lines = ["  ".join(["check".ljust(width)] + [h.ljust(w) for h, w in zip(hosts, cols, strict=True)])]
    for c in CHECKS:
        cells = [result["hosts"][h][c]["status"].replace(NA, "-") for h in hosts]
        lines.append("  ".join([c.ljust(width)] + [x.ljust(w) for x, w in zip(cells, cols, strict=True)]))
    for h in hosts:
        for c in CHECKS:
            cell = result["hosts"][h][c]
            if cell.get("note"):
                lines.append(f"{cell['note'].upper()} {h} {c}: {cell['detail']}")
    for f in result["failures"]:
        lines.append(f"FAIL {f['host']} {f['check']}: {f['detail']}")
        if f["fix"]:
            lines.append(f"     fix: {f['fix']}")
    if result["bandwidth"] and result["bandwidth"].get("busbw_gbit_s"):
        bw = result["bandwidth"]
        lines.append(f"gloo all-reduce {bw['bytes'] / (1 << 20):.0f} MB: {bw['median_s']} s, "
                     f"bus bandwidth {bw['busbw_gbit_s']} Gbit/s")
    if result.get("left_out") and result.get("left_out_links"):
        lines.append(f"not asked (--limit): {', '.join(result['left_out'])}; only the links between them and "
                     "the chosen nodes were checked, not their own checks nor the gloo smoke test (preflight "
                     "without --limit checks them)")
    elif result.get("left_out"):
        lines.append(f"not asked (--limit): {', '.join(result['left_out'])}; links toward them and the gloo "
                     "smoke test were not checked (preflight without --limit checks them)")
    if result["failures"]:
        lines.append(f"preflight: FAIL ({len(result['failures'])} failing checks)")
    elif result["not_run"]:
        lines.append(f"preflight: INCOMPLETE ({len(result['not_run'])} checks not run: "
                     f"{', '.join(result['not_run'][:6])})")
    else:
        lines.append("preflight: ok")
    return "\n".join(lines)


def gate(result: dict) -> dict:
    """May the gloo smoke test run? Not when a check it depends on failed: it would only hang until
    its watchdog and then blame the network that the failed check already named."""
    failed = [f"{f['host']}:{f['check']}" for f in result["failures"]
              if f["check"] in SMOKE_NEEDS or f["host"] in result.get("unprepared", ())]
    if result.get("left_out"):
        return {"smoke": False, "failed": [], "left_out": True,
                "reason": f"it needs every rank: {', '.join(result['left_out'])} left out by --limit"}
    if failed:
        return {"smoke": False, "failed": failed,
                "reason": f"{', '.join(failed[:4])}{' ...' if len(failed) > 4 else ''} failed first"}
    return {"smoke": True, "failed": [], "reason": ""}


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_file(path, text, 0o644)


def read_inputs(args) -> collect.Inputs:
    if args.in_dir:
        return collect.load_dir(args.in_dir)
    try:
        return collect.from_bundle(json.loads(sys.stdin.read()))
    except ValueError as e:
        raise InputError(f"the bundle on stdin is not JSON: {e}") from None
    except InputError as e:
        raise InputError(f"the bundle on stdin: {e}") from None


def control_code(args, inputs: collect.Inputs) -> dict:
    """{name: {"sha256": ...}} of the control host's code: what each node's copy must equal."""
    code = dict(inputs.control_code)
    if args.gate:
        return code
    for d in args.code:
        info = hashing.tree_hash(d)
        if info.get("error"):
            raise InputError(f"--code: {info['error']}")
        code[d.resolve().name] = info
    for spec in args.code_tree:
        from ddplab import code_tree

        name, _, src = spec.partition("=")
        if not src:
            continue  # no code of yours (ddplab_code_dir "")
        if not name:
            raise InputError(f"--code-tree {spec!r}: use NAME=SRC_FOLDER")
        try:
            tree = code_tree.plan([{"src": src, "dest": name, "mode": "gitignore",
                                    "include": args.code_include}])["trees"][0]
        except DdplabError as e:
            raise InputError(str(e)) from None
        code[name] = {"sha256": tree["hash"]}
    code.update(code_refs(args.code_ref))
    return code


def control_sync(args) -> dict:
    """{dest: {"sha256", "files", "path"}} of each ddplab_sync_dirs src here (none with --gate)."""
    out = {}
    for text in [] if args.gate else args.sync_dir:
        try:
            entry = json.loads(text)
            src, dest = os.path.expanduser(str(entry["src"])), str(entry["dest"])
        except (ValueError, TypeError, KeyError):
            raise InputError(f"--sync-dir {text!r}: use a JSON {{\"src\": ..., \"dest\": ...}}") from None
        info = hashing.tree_hash(src)
        if info.get("error"):
            raise InputError(f"ddplab_sync_dirs: src {info['error']} on the control host")
        out[dest] = info
    return out


def code_refs(refs: list[str]) -> dict:
    out = {}
    for ref in refs:
        name, _, sha = ref.partition("=")
        if not name or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise InputError(f"--code-ref {ref!r}: use NAME=<64 hex digits>")
        out[name] = {"sha256": sha}
    return out


def add_parser(sub):
    p = sub.add_parser("preflight-verdict", help="judge the preflight's probe results (bundle on stdin)",
                       description=__doc__.split("\n")[0])
    p.add_argument("--in", dest="in_dir", type=Path, help="judge this dump folder instead of stdin")
    p.add_argument("--out", type=Path, default=Path("runs/preflight/latest.json"), help="verdict JSON")
    p.add_argument("--manifest", type=Path, help="control host's manifest.json (default: IN/manifest.json)")
    p.add_argument("--data-dir", default="",
                   help="control host's shard folder: its manifest.json ('' = no shards asked for)")
    p.add_argument("--code", action="append", type=Path, default=[],
                   help="control host's code folder to compare with (repeatable)")
    p.add_argument("--code-tree", action="append", default=[], metavar="NAME=SRC",
                   help="your code folder SRC, hashed as code-tree would sync it, is the node's NAME/")
    p.add_argument("--code-include", action="append", default=[], metavar="GLOB",
                   help="a ddplab_code_include glob: git-ignored files of --code-tree's folder it ships")
    p.add_argument("--code-ref", action="append", default=[], metavar="NAME=SHA256",
                   help="the control host's tree hash of code folder NAME (repeatable)")
    p.add_argument("--sync-dir", action="append", default=[], metavar="JSON",
                   help='a ddplab_sync_dirs entry {"src": ..., "dest": ...}: the node\'s dest must equal src')
    p.add_argument("--dump", default="", help="also write the inputs to this folder (debugging; '' = no)")
    p.add_argument("--gate", action="store_true",
                   help="print {\"smoke\": true/false, \"reason\": ...}: may the gloo smoke test run? "
                        "(no table, --out untouched, exit 0)")
    p.set_defaults(func=cmd_verdict)


def shard_sizes(folder: Path, manifest: dict) -> dict[str, int]:
    """{shard: bytes} of the control host's shards beside the manifest (the disk check's shard bytes)."""
    out = {}
    for name in hashing.manifest_files(manifest):
        with contextlib.suppress(OSError):
            out[name] = (folder / name).stat().st_size
    return out


def cmd_verdict(args) -> int:
    try:
        code_refs(args.code_ref)  # bad arguments first, before reading anything
        inputs = read_inputs(args)
        if args.dump:
            collect.dump(inputs, Path(args.dump))
        manifest = None
        if args.data_dir and not args.manifest:
            args.manifest = Path(args.data_dir) / "manifest.json"
        mpath = args.manifest or (args.in_dir / "manifest.json" if args.in_dir else None)
        if args.manifest or (mpath and mpath.exists()):
            manifest, err = hashing.load_manifest(mpath)
            if err:
                raise InputError(f"control manifest: {err}")
        result = judge(Judge(inputs, manifest, control_code(args, inputs), control_sync(args),
                             shard_sizes(mpath.parent, manifest) if manifest else {}))
    except InputError as e:
        raise DdplabError(str(e)) from None
    if args.gate:
        print(json.dumps(gate(result)))
        return 0
    write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    print(table(result))
    print(f"written: {args.out}")
    return 0 if result["ok"] else 1


def main(argv=None) -> int:
    """Run the verb alone (tests): ``main(["--in", DIR])``."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m ddplab")
    add_parser(ap.add_subparsers(dest="cmd", required=True))
    args = ap.parse_args(["preflight-verdict", *(argv or [])])
    try:
        return cmd_verdict(args)
    except DdplabError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2
