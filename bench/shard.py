"""make bench-shard: DDP against --shard on simulated hosts with a memory cap each (root).

For each lab size (--hosts, default 2) simlan brings up that many hosts, each capped (`--mem-limit`,
--cap-mb). For each width of a depth-4 model, smallest first, each layout (DDP, sharded) trains a short run
(torchrun over gloo between the hosts, one rank a host, a final checkpoint): it trains, or a rank is
OOM-killed; a layout stops at its first failure. Then, at the largest width both train, --rounds interleaved
rounds (DDP, sharded, DDP, ...) give each layout's tokens/s (median). Writes results.json and table.md to
--out (bench/results/shard). Each run's rank peak RSS is from its summary; the estimate is trainer/sizes.py's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simlan import cluster as simlan  # noqa: E402
from trainer.data.shards import prepare  # noqa: E402
from trainer.sizes import AGENT_BYTES, GPTConfig, estimate_train_memory, param_count  # noqa: E402

PORT = 29531
DEPTH, SEQ, BATCH = 4, 32, 1


def run(c, root: Path, hosts: int, width: int, shard: bool, steps: int) -> dict:
    """One run on `hosts` hosts: {"ok", "killed", "tokens_per_sec", "peak_rss_mib", "seconds"}."""
    out = root / "runs"
    shutil.rmtree(out, ignore_errors=True)
    args = ["--depth", str(DEPTH), "--n-embd", str(width), "--n-head", str(width // 64), "--seq-len",
            str(SEQ), "--batch-size", str(BATCH), "--threads", "1", "--steps", str(steps),
            "--check-every", "0", "--val-row-groups", "0", "--timing-warmup-steps", "1",
            *(["--shard"] if shard else [])]
    procs, t0 = [], time.monotonic()
    for rank in range(hosts):
        h = f"node{rank}"
        argv = ["env", f"PYTHONPATH={REPO}", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0",
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--node-rank={rank}",
                "--nproc-per-node=1", f"--master-addr={c.host('node0').addr}", f"--master-port={PORT}",
                "--rdzv-conf=timeout=60",
                "-m", "trainer", "--data", str(root / "data"), "--out", str(out / h), *args]
        procs.append(c.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=900) for p in procs]
    killed = any("(SIGKILL)" in err or "exitcode: -9" in err for _, err in results)
    ok = all(p.returncode == 0 for p in procs)
    rec = {"ok": ok, "killed": killed, "seconds": round(time.monotonic() - t0, 1)}
    if ok:
        s = json.loads((out / "node0" / "summary.json").read_text())
        rec |= {"tokens_per_sec": s["tokens_per_sec"],
                "peak_rss_mib": [r["peak_rss_bytes"] >> 20 for r in s["ranks"]]}
    elif not killed:
        rec["error"] = [ln for _, err in results for ln in err.splitlines() if "ddplab: error" in ln][:2]
    return rec


def estimate_mib(width: int, hosts: int, shard: bool) -> int:
    c = GPTConfig(seq_len=SEQ, n_layer=DEPTH, n_embd=width, n_head=width // 64)
    return estimate_train_memory(c, BATCH, hosts, shard=shard) >> 20


def bench_lab(hosts: int, args, root: Path) -> dict:
    c = simlan.up(hosts, mem_limit=tuple(f"node{i}={args.cap_mb}M" for i in range(hosts)), force=True)
    rows, alive = [], {"ddp": True, "shard": True}
    for width in args.widths:
        gcfg = GPTConfig(n_layer=DEPTH, n_embd=width, n_head=width // 64)
        row = {"width": width, "params": param_count(gcfg)}
        for mode in ("ddp", "shard"):
            row[f"{mode}_estimate_mib"] = estimate_mib(width, hosts, mode == "shard")
            if alive[mode]:
                row[mode] = run(c, root, hosts, width, mode == "shard", args.steps)
                alive[mode] = row[mode]["ok"]
                print(f"{hosts} hosts, width {width}, {mode}: {row[mode]}", flush=True)
        rows.append(row)
    largest = {m: max((r["params"] for r in rows if r.get(m, {}).get("ok")), default=0)
               for m in ("ddp", "shard")}
    both = [r["width"] for r in rows if r.get("ddp", {}).get("ok") and r.get("shard", {}).get("ok")]
    speed = {"ddp": [], "shard": []}
    if both:
        for _ in range(args.rounds):  # interleaved: a busy moment lands on both layouts
            for mode in ("ddp", "shard"):
                r = run(c, root, hosts, both[-1], mode == "shard", args.steps)
                if r["ok"]:
                    speed[mode].append(r["tokens_per_sec"])
    med = {m: statistics.median(v) if v else None for m, v in speed.items()}
    simlan.down()
    return {"hosts": hosts, "cap_mib": args.cap_mb, "agent_mib": AGENT_BYTES >> 20, "rows": rows,
            "largest_params": largest,
            "largest_ratio": largest["shard"] / largest["ddp"] if largest["ddp"] else None,
            "speed_width": both[-1] if both else None, "tokens_per_sec": speed, "tokens_per_sec_median": med,
            "step_time_ratio": med["ddp"] / med["shard"] if med["ddp"] and med["shard"] else None}


def table(labs: list[dict]) -> str:
    lines = ["| hosts | width | params | DDP est. MiB | DDP | sharded est. MiB | sharded |",
             "|---|---|---|---|---|---|---|"]

    def cell(r):
        if r is None:
            return "-"
        if r["ok"]:
            return f"trains (peak RSS {max(r['peak_rss_mib'])} MiB)"
        return "OOM-killed" if r["killed"] else "failed"

    for lab in labs:
        for r in lab["rows"]:
            lines.append(f"| {lab['hosts']} | {r['width']} | {r['params'] / 1e6:.1f}M | "
                         f"{r['ddp_estimate_mib']} | {cell(r.get('ddp'))} | {r['shard_estimate_mib']} | "
                         f"{cell(r.get('shard'))} |")
    lines.append("")
    for lab in labs:
        big = lab["largest_params"]
        ratio = f"{lab['largest_ratio']:.2f}x" if lab["largest_ratio"] else "-"
        st = f"{lab['step_time_ratio']:.2f}x" if lab["step_time_ratio"] else "-"
        med = {m: f"{v:,.0f}" if v else "-" for m, v in lab["tokens_per_sec_median"].items()}
        lines.append(f"- {lab['hosts']} hosts capped at {lab['cap_mib']} MiB: largest model DDP "
                     f"{big['ddp'] / 1e6:.1f}M, sharded {big['shard'] / 1e6:.1f}M ({ratio}); at width "
                     f"{lab['speed_width']} sharded step time {st} DDP's (median tokens/s DDP "
                     f"{med['ddp']}, sharded {med['shard']})")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="+", default=[2])
    p.add_argument("--cap-mb", type=int, default=1100)
    p.add_argument("--widths", type=int, nargs="+", default=[640, 704, 768, 832, 896, 960, 1024])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "shard"))
    args = p.parse_args()
    root = Path("/var/tmp/ddplab-bench-shard")
    shutil.rmtree(root, ignore_errors=True)
    prepare(root / "data", None, 64, 4, 4, seed=0)
    labs = [bench_lab(n, args, root) for n in args.hosts]
    shutil.rmtree(root, ignore_errors=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"labs": labs, "args": vars(args)}, indent=2) + "\n")
    (out / "table.md").write_text(table(labs))
    print(table(labs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
