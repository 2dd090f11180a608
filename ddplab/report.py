"""Merge a collected run (runs/<run_id>/<host>/...) into report.md, summary.json and loss.png.

Input: what playbooks/collect_logs.yml brings back, per host: metrics.rank{R}.jsonl, summary.rank{R}.json,
summary.json (rank 0's host), exit_code, launch.log, trainer.env, code.json (docs/contracts.md). Files are
found anywhere under each host folder (the trainer writes them in out/). A host without metrics (your own
entry point, or a rank that died before its first step) still gets a row with its exit code; when its
launch.log holds the lines your code printed (nodeprobe/log_metrics.py: nanoGPT's, nanochat's, or
ddplab_log_pattern), the row gets their last step, final loss, tokens/s and step time (medians over the steps
after the first), loss.png their loss curve, and the run its last step, last loss and tokens/s: the sum of
the nodes' medians (nanoGPT and nanochat print the run's figure on rank 0 only). A row's last step is the last
step number the rank wrote, in its own count: the built-in trainer's starts at 1 (its steps made), nanochat's
and nanoGPT's at 0.
"""

import json
import os
import sys
import tarfile
from pathlib import Path

from ddplab import lowcomm_advice, tb_export, unpack
from ddplab.errors import DdplabError
from nodeprobe import log_metrics
from nodeprobe.cpu_power import GOVERNOR_FIX
from trainer import straggler_rule

COLUMNS = [("host", "host"), ("rank", "rank"), ("exit", "exit"), ("last step", "last_step"),
           ("final loss", "final_loss"), ("tokens/s", "tokens_per_sec"), ("step ms p50", "step_ms_p50"),
           ("all-reduce ms p50", "allreduce_ms_p50"), ("comm/compute", "comm_compute_ratio"),
           # share: sequences of the global batch per step (moves with --balance); wait: the exposed
           # all-reduce, where a rank waits for slower peers
           ("share p50", "share_p50"), ("compute ms p50", "compute_ms_p50"), ("wait ms p50", "wait_ms_p50")]


def _read_json(path):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise DdplabError(f"cannot read {path}: {e}; collect the run again (playbooks/collect_logs.yml)") \
            from e


def _read_jsonl(path):
    rows = []
    lines = Path(path).read_text().splitlines()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            # A rank killed mid-write leaves a torn last line; anything else is a broken file.
            if n < len(lines):
                raise DdplabError(f"{path} line {n} is not JSON; collect the run again") from None
    return rows


def _median(values):
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def _env_value(host, key):
    for p in host.rglob("trainer.env"):
        for line in p.read_text(errors="replace").splitlines():
            if line.startswith(key + "="):
                return line.split("=", 1)[1].strip("'\"")
    return None


def host_dirs(run_dir) -> list[Path]:
    """The collected hosts' folders of a run (runs/<run_id>/<host>/), without the TensorBoard export."""
    return sorted(p for p in Path(run_dir).iterdir() if p.is_dir() and p.name != tb_export.DIR)


def load_code(run_dir):
    """{host: code.json} for the hosts that recorded the code they ran (roles/launch)."""
    out = {}
    for host in host_dirs(run_dir):
        path = host / "code.json"
        if path.is_file():
            info = _read_json(path)
            out[host.name] = {"hash": info.get("hash"), "trees": [
                {k: t.get(k) for k in ("dest", "method", "hash", "git_commit", "git_dirty")}
                for t in info.get("trees", [])]}
    return out


def host_log(host: Path, pattern: str) -> dict:
    """The user's printed lines in the host's launch.log (the run folder's, else the first found)."""
    path = host / "launch.log"
    if not path.is_file():
        path = next(iter(sorted(host.rglob("launch.log"))), None)
    if path is None:
        return {"format": None, "records": [], "context": {}}
    try:
        return log_metrics.read_log(str(path), pattern, whole=True)
    except log_metrics.PatternError as e:
        raise DdplabError(f"ddplab_log_pattern {e}; fix it (python -m ddplab validate checks it)") from None


def load_run(run_dir, log_pattern=""):
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise DdplabError(f"run folder {run_dir} does not exist; collect it with playbooks/collect_logs.yml")
    hosts = host_dirs(run_dir)
    ranks, run_summary = [], None
    for host in hosts:
        exit_code = None
        for p in host.rglob("exit_code"):
            try:
                exit_code = int(p.read_text().strip())
            except ValueError:
                exit_code = None
        for metrics in sorted(host.rglob("metrics.rank*.jsonl")):
            rank = int(metrics.name[len("metrics.rank"):-len(".jsonl")])
            rows = _read_jsonl(metrics)
            summ_path = metrics.with_name(f"summary.rank{rank}.json")
            summ = _read_json(summ_path) if summ_path.exists() else {}
            ranks.append({"host": host.name, "rank": rank, "exit": exit_code, "rows": rows, "summary": summ})
        for s in host.rglob("summary.json"):
            run_summary = _read_json(s)
        if not any(r["host"] == host.name for r in ranks) and (exit_code is not None
                                                               or any(host.rglob("launch.log"))):
            ranks.append({"host": host.name, "rank": None, "node_rank": _env_value(host, "NODE_RANK"),
                          "exit": exit_code, "rows": [], "summary": {}, "log": host_log(host, log_pattern)})
    if not ranks:
        raise DdplabError(f"no metrics.rank*.jsonl under {run_dir}; did the run start? "
                          "(see runs/<run_id>/<host>/launch.log and pane.txt)")
    ranks.sort(key=lambda r: (r["rank"] is None, r["rank"] or 0, r["host"]))
    return ranks, run_summary


def printed(r) -> list[dict]:
    """The records of the lines a host's code printed ([] for the built-in trainer's ranks)."""
    return (r.get("log") or {}).get("records") or []


def _log_row(r):
    """A row of a host whose figures come from its printed lines: the columns that have an equivalent."""
    figures = log_metrics.summary(r["log"]["records"])
    return {**{k: None for _, k in COLUMNS}, "host": r["host"], "rank": r["rank"], "exit": r["exit"],
            **{k: figures[k] for k in ("last_step", "final_loss", "tokens_per_sec", "step_ms_p50")}}


def log_summary(ranks) -> dict:
    """The run's figures from the hosts' printed lines ({} when none printed any)."""
    logs = [r for r in ranks if printed(r)]
    if not logs:
        return {}
    figures = [log_metrics.summary(r["log"]["records"]) for r in logs]
    last = max(figures, key=lambda f: f["last_step"] if f["last_step"] is not None else -1)
    rates = [f["tokens_per_sec"] for f in figures if f["tokens_per_sec"] is not None]
    out = {"metrics_from": f"launch.log ({', '.join(sorted({r['log']['format'] for r in logs}))} lines)",
           "last_step": last["last_step"], "loss_last": last["final_loss"],
           "tokens_per_sec": sum(rates) if rates else None,
           "val_loss": last["val_loss"], "val_bpb": last["val_bpb"]}
    return {k: v for k, v in out.items() if v is not None}


def _row(r):
    if printed(r):
        return _log_row(r)
    rows, summ = r["rows"], r["summary"]
    last_step = rows[-1].get("step") if rows else None
    return {
        "host": r["host"], "rank": r["rank"], "exit": r["exit"], "last_step": last_step,
        "final_loss": rows[-1].get("loss") if rows else None,
        "tokens_per_sec": summ.get("tokens_per_sec", _median(x.get("tokens_per_sec") for x in rows)),
        "step_ms_p50": _median(x.get("dt_ms") for x in rows),
        "allreduce_ms_p50": summ.get("allreduce_ms_p50", _median(x.get("allreduce_ms") for x in rows)),
        "comm_compute_ratio": summ.get("comm_compute_ratio"),
        "share_p50": _median(x.get("share") for x in rows),
        "compute_ms_p50": summ.get("compute_ms_p50", _median(x.get("compute_ms") for x in rows)),
        "wait_ms_p50": summ.get("wait_ms_p50", _median(x.get("wait_ms", x.get("exposed_ms")) for x in rows)),
    }


def stragglers(ranks) -> list[dict]:
    """The ranks whose median compute time per sequence over the run was straggler_rule.RATIO times the
    others' median (the built-in trainer's metrics), slowest first."""
    speeds = {(r["host"], r["rank"]): straggler_rule.per_sequence(r["rows"]) for r in ranks if r["rows"]}
    slow = sorted(straggler_rule.named(speeds).items(), key=lambda kv: -kv[1])
    return [{"host": host, "rank": rank, "times": round(times, 2), "ms_per_seq": round(speeds[host, rank], 1)}
            for (host, rank), times in slow]


def straggler_lines(slow: list[dict], balanced: bool) -> list[str]:
    fix = (" (ddplab_balance was on: its share of the batch was already smaller, see share p50)" if balanced
           else ", or set ddplab_balance: true to give it a smaller share of the batch")
    return [f"- straggler: {s['host']} (rank {s['rank']}) computed {s['times']:.1f}x the others' median per "
            f"sequence ({s['ms_per_seq']} ms); every rank waited for it: check its load, power governor "
            f"(`{GOVERNOR_FIX}`) and thermals{fix}" for s in slow]


def _fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def markdown(run_dir, table, merged):
    lines = [f"# Run {Path(run_dir).name}", ""]
    for key in ("world_size", "params", "steps", "last_step", "tokens_per_sec", "byte_equivalent",
                "torch_version", "dtype", "threads", "hosts", "tokens_seen", "global_batch_tokens",
                "loss_last", "val_loss", "val_bpb", "metrics_from"):
        if key in merged:
            value = merged[key]
            text = ", ".join(map(str, value)) if isinstance(value, list) else _fmt(value)
            lines.append(f"- {key}: {text}")
    if merged.get("collected"):
        missing = merged.get("not_collected") or []
        lines.append(f"- logs collected from: {', '.join(merged['collected'])}"
                     + (f" (not collected: {', '.join(missing)}; playbooks/collect_logs.yml -l HOST adds one)"
                        if missing else ""))
    balance = merged.get("balance")
    if balance:
        changes = balance.get("changes") or []
        last = f", last at step {changes[-1]['step']}" if changes else ""
        lines.append(f"- balance: shares {balance['shares']} of {balance['global_seqs']} sequences per step "
                     f"({len(changes)} changes{last})")
    if merged.get("stragglers"):
        lines += straggler_lines(merged["stragglers"], bool(balance))
    lines += ["", "| " + " | ".join(c for c, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_fmt(row[k]) for _, k in COLUMNS) + " |" for row in table]
    code = merged.get("code") or {}
    if code:
        hashes = sorted({c["hash"] or "-" for c in code.values()})
        trees = next(iter(code.values()))["trees"]
        git = [f"{t['dest']} {t['git_commit'][:12]}{' (dirty)' if t['git_dirty'] else ''}"
               for t in trees if t.get("git_commit")]
        same = "identical on every node" if len(hashes) == 1 else "DIFFERS between nodes"
        git_text = "; git " + ", ".join(git) if git else ""
        lines.insert(2, f"- code: {', '.join(h[:12] for h in hashes)} ({same}){git_text}")
    if merged.get("tensorboard"):
        lines.append(f"- TensorBoard: `tensorboard --logdir {merged['tensorboard']}`")
    if merged.get("lowcomm_advice"):
        lines += lowcomm_advice.markdown(merged["lowcomm_advice"])
    plotted = merged.get("has_metrics") or merged.get("has_log_metrics")
    lines += [""] + (["![loss](loss.png)", ""] if plotted else [])
    return "\n".join(lines)


def plot(ranks, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in ranks:
        rows = r["rows"] or r["log"]["records"]
        xs = [x["step"] for x in rows if x.get("loss") is not None]
        ys = [x["loss"] for x in rows if x.get("loss") is not None]
        label = f"rank {r['rank']} ({r['host']})" if r["rows"] else f"{r['host']} ({r['log']['format']})"
        ax.plot(xs, ys, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def write_report(run_dir, nodes=(), log_pattern=""):
    """nodes: every node of the lab (a collect under --limit says which of them it holds); log_pattern:
    ddplab_log_pattern, for the lines of your own code."""
    run_dir = Path(run_dir)
    ranks, run_summary = load_run(run_dir, log_pattern)
    table = [_row(r) for r in ranks]
    merged = {**log_summary(ranks), **(run_summary or {})}
    code = load_code(run_dir)
    logged = [r for r in ranks if not r["rows"] and any("loss" in x for x in printed(r))]
    merged.update(run_id=run_dir.name, ranks=table, has_metrics=any(r["rows"] for r in ranks),
                  exit_codes={f"{r['host']}/rank{r['rank']}" if r["rank"] is not None
                              else f"{r['host']}/node{r.get('node_rank')}": r["exit"] for r in ranks},
                  all_exited_zero=all(r["exit"] == 0 for r in ranks),
                  collected=[p.name for p in host_dirs(run_dir)])
    if logged:
        merged["has_log_metrics"] = True  # loss.png from the lines your code printed
    if nodes:
        merged["not_collected"] = [n for n in nodes if n not in merged["collected"]]
    if code:
        merged.update(code=code, code_identical=len({c["hash"] for c in code.values()}) == 1)
    slow = stragglers(ranks)
    if slow:
        merged["stragglers"] = slow
    advice = lowcomm_advice.advice(merged, lowcomm_advice.load_study())
    if advice:
        merged["lowcomm_advice"] = advice
    if merged["has_metrics"] and tb_export.available():
        merged["tensorboard"] = str(tb_export.write(run_dir, ranks))
    elif merged["has_metrics"]:
        print(f"ddplab: note: no TensorBoard event files (tensorboard is not installed); to get them in "
              f"{run_dir / tb_export.DIR}: {tb_export.INSTALL_HINT}", file=sys.stderr)
    files = {"report.md": markdown(run_dir, table, merged),
             "summary.json": json.dumps(merged, indent=2, sort_keys=True) + "\n"}
    for name, text in files.items():
        tmp = run_dir / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, run_dir / name)
    if merged["has_metrics"] or logged:
        plot([r for r in ranks if r["rows"]] + logged, run_dir / "loss.png")
    return files["report.md"]


def unpack_archives(run_dir, nodes):
    """Unpack each fetched ``<run_dir>/<node>.tgz`` (roles/logs) into ``<run_dir>/<node>/`` over what an
    earlier collect left there, then remove it: one control-side step for every node, not three per node.
    The archives come from the nodes: ddplab/unpack.py takes plain relative files and folders only, and
    refuses an archive with anything else before writing any of it (the archive then stays, for a look)."""
    run_dir = Path(run_dir)
    unpacked = []
    for node in nodes:
        archive = run_dir / f"{node}.tgz"
        if not archive.is_file():
            continue
        dest = run_dir / node
        dest.mkdir(parents=True, exist_ok=True)
        try:
            unpack.unpack(archive, dest)
        except DdplabError as e:
            raise DdplabError(f"{node}'s archive {archive} is refused: {e}; nothing of it was unpacked; "
                              "a node packs plain files only (nodeprobe/pack_run.py): look at what else "
                              f"wrote it on {node}") from None
        except (OSError, tarfile.TarError) as e:
            raise DdplabError(f"cannot unpack {archive} ({node}'s logs): {e}; collect the run again "
                              "(playbooks/collect_logs.yml)") from e
        archive.unlink()
        unpacked.append(node)
    return unpacked


def cmd_report(args):
    nodes = [n for n in args.nodes.split(",") if n]
    if args.unpack:
        try:
            unpack_archives(args.run_dir, [n for n in args.unpack.split(",") if n])
        except DdplabError as e:  # exit 1, not 2: roles/logs takes 2 for "nothing to merge yet"
            print(f"ddplab: error: {e}", file=sys.stderr)
            return 1
    if not args.no_report:
        print(write_report(args.run_dir, nodes, args.log_pattern))


def add_parser(sub):
    p = sub.add_parser("report", help="merge a collected run into report.md, summary.json, loss.png")
    p.add_argument("run_dir", help="runs/<run_id> as written by playbooks/collect_logs.yml")
    p.add_argument("--nodes", default="", help="every node of the lab, comma-separated")
    p.add_argument("--unpack", default="", metavar="NODES",
                   help="first unpack these nodes' fetched <run_dir>/<node>.tgz into <run_dir>/<node>/")
    p.add_argument("--no-report", action="store_true", help="only unpack")
    p.add_argument("--log-pattern", default="", metavar="REGEX",
                   help="ddplab_log_pattern: your code's lines in launch.log (\"\": nanoGPT's, nanochat's)")
    p.set_defaults(func=cmd_report)
