"""make bench-shard: DDP against --shard on simulated hosts with a memory cap each (root).

Capacity (--hosts, default 2): simlan brings up that many hosts, each capped (`--mem-limit`, --cap-mb).
For each width of a --depth model, smallest first, each layout (DDP, sharded) trains a short run (torchrun
over gloo between the hosts, one rank a host, a final checkpoint): it trains, or a rank is OOM-killed; a
layout stops at its first failure. Then, at the largest width both train, --rounds interleaved rounds
(DDP, sharded, DDP, ...) give each layout's tokens/s (median).

Speed (--speed-hosts, default none): at --speed-width, for each batch x sequence of --speed-tokens, the
variants of VARIANTS (DDP and sharded with each of its speed settings) in --rounds interleaved rounds: the
median tokens/s with its spread, the collectives' time and bytes per step and each rank's peak RSS.

Writes results.json, table.md and shard.png to --out (bench/results/shard), keeping the labs of the host
counts not run this time. Each run's rank peak RSS is from its summary; the estimate is trainer/sizes.py's.
Every run's files live in a folder this bench makes (mkdtemp) and removes.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simlan import cluster as simlan  # noqa: E402
from trainer.data.shards import prepare  # noqa: E402
from trainer.sizes import AGENT_BYTES, GPTConfig, estimate_train_memory, param_count  # noqa: E402

PORT = 29531
SEQ, BATCH = 32, 1
# the speed study's layouts: name -> trainer flags
VARIANTS = {"ddp": [],
            "shard": ["--shard"],
            "shard, keep gathered": ["--shard", "--no-reshard-after-forward"],
            "shard, keep freed": ["--shard", "--no-shard-return-memory"],
            "shard, keep both": ["--shard", "--no-reshard-after-forward", "--no-shard-return-memory"]}


def load_line() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def run(c, root: Path, hosts: int, depth: int, width: int, flags: list[str], steps: int,
        batch: int = BATCH, seq: int = SEQ) -> dict:
    """One run on `hosts` hosts: {"ok", "killed", "tokens_per_sec", "peak_rss_mib", "seconds", ...}."""
    out = root / "runs"
    shutil.rmtree(out, ignore_errors=True)  # inside the bench's own folder
    args = ["--depth", str(depth), "--n-embd", str(width), "--n-head", str(width // 64), "--seq-len",
            str(seq), "--batch-size", str(batch), "--threads", "1", "--steps", str(steps),
            "--check-every", "0", "--val-row-groups", "0", "--timing-warmup-steps", "1", *flags]
    procs, t0, load = [], time.monotonic(), load_line()
    for rank in range(hosts):
        h = f"node{rank}"
        argv = ["env", f"PYTHONPATH={REPO}", "OMP_NUM_THREADS=1", "GLOO_SOCKET_IFNAME=eth0",
                sys.executable, "-m", "torch.distributed.run", f"--nnodes={hosts}", f"--node-rank={rank}",
                "--nproc-per-node=1", f"--master-addr={c.host('node0').addr}", f"--master-port={PORT}",
                "--rdzv-conf=timeout=60",
                "-m", "trainer", "--data", str(root / "data"), "--out", str(out / h), *args]
        procs.append(c.popen(h, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = [p.communicate(timeout=1800) for p in procs]
    killed = any("(SIGKILL)" in err or "exitcode: -9" in err for _, err in results)
    ok = all(p.returncode == 0 for p in procs)
    rec = {"ok": ok, "killed": killed, "seconds": round(time.monotonic() - t0, 1), "load": load}
    if ok:
        s = json.loads((out / "node0" / "summary.json").read_text())
        rec |= {"tokens_per_sec": s["tokens_per_sec"],
                "peak_rss_mib": [r["peak_rss_bytes"] >> 20 for r in s["ranks"]]}
        metrics = (out / "node0" / "metrics.rank0.jsonl").read_text().splitlines()
        steps_rec = [json.loads(ln) for ln in metrics]
        timed = [r for r in steps_rec if "dt_ms" in r][1:] or steps_rec[-1:]
        for k in ("dt_ms", "compute_ms", "allreduce_ms", "exposed_ms", "allreduce_bytes"):
            rec[k] = statistics.median(r[k] for r in timed)
    elif not killed:
        rec["error"] = [ln for _, err in results for ln in err.splitlines() if "ddplab: error" in ln][:2]
    return rec


def estimate_mib(depth: int, width: int, hosts: int, shard: bool) -> int:
    c = GPTConfig(seq_len=SEQ, n_layer=depth, n_embd=width, n_head=width // 64)
    return estimate_train_memory(c, BATCH, hosts, shard=shard) >> 20


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)} \
        if values else {"median": None, "min": None, "max": None, "n": 0}


def bench_lab(hosts: int, args, root: Path) -> dict:
    c = simlan.up(hosts, mem_limit=tuple(f"node{i}={args.cap_mb}M" for i in range(hosts)), force=True)
    rows, alive, loads = [], {"ddp": True, "shard": True}, [load_line()]
    for width in args.widths:
        row = {"width": width, "params": param_count(GPTConfig(n_layer=args.depth, n_embd=width,
                                                               n_head=width // 64))}
        for mode in ("ddp", "shard"):
            row[f"{mode}_estimate_mib"] = estimate_mib(args.depth, width, hosts, mode == "shard")
            if alive[mode]:
                row[mode] = run(c, root, hosts, args.depth, width, VARIANTS[mode], args.steps)
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
                r = run(c, root, hosts, args.depth, both[-1], VARIANTS[mode], args.steps)
                if r["ok"]:
                    speed[mode].append(r["tokens_per_sec"])
    loads.append(load_line())
    med = {m: statistics.median(v) if v else None for m, v in speed.items()}
    simlan.down()
    return {"hosts": hosts, "depth": args.depth, "cap_mib": args.cap_mb, "agent_mib": AGENT_BYTES >> 20,
            "rows": rows, "largest_params": largest,
            "largest_ratio": largest["shard"] / largest["ddp"] if largest["ddp"] else None,
            "speed_width": both[-1] if both else None, "tokens_per_sec": speed, "tokens_per_sec_median": med,
            "step_time_ratio": med["ddp"] / med["shard"] if med["ddp"] and med["shard"] else None,
            "load": loads}


def bench_speed(hosts: int, args, root: Path) -> dict:
    """Every variant at every batch x sequence, --rounds interleaved rounds (variants in turn, each round)."""
    c = simlan.up(hosts, mem_limit=tuple(f"node{i}={args.cap_mb}M" for i in range(hosts)), force=True)
    settings = [tuple(int(x) for x in s.split("x")) for s in args.speed_tokens]
    runs = {f"{b}x{t}": {v: [] for v in args.variants} for b, t in settings}
    loads = [load_line()]
    for i in range(args.rounds):
        for b, t in settings:
            for v in args.variants:
                r = run(c, root, hosts, args.depth_speed, args.speed_width, VARIANTS[v], args.steps, b, t)
                runs[f"{b}x{t}"][v].append(r)
                print(f"speed round {i}, {b}x{t}, {v}: {r}", flush=True)
    loads.append(load_line())
    simlan.down()
    out = {}
    for key, per in runs.items():
        ddp = spread([r["dt_ms"] for r in per.get("ddp", []) if r["ok"]])["median"]
        out[key] = {}
        for v, rs in per.items():
            good = [r for r in rs if r["ok"]]
            dt = spread([r["dt_ms"] for r in good])
            out[key][v] = {"tokens_per_sec": spread([r["tokens_per_sec"] for r in good]), "step_ms": dt,
                           "step_time_vs_ddp": dt["median"] / ddp if ddp and dt["median"] else None,
                           "comm_ms": spread([r["allreduce_ms"] for r in good]),
                           "exposed_ms": spread([r["exposed_ms"] for r in good]),
                           "comm_bytes": good[0]["allreduce_bytes"] if good else None,
                           "peak_rss_mib": max((max(r["peak_rss_mib"]) for r in good), default=None),
                           "failed": len(rs) - len(good)}
    return {"hosts": hosts, "depth": args.depth_speed, "width": args.speed_width, "cap_mib": args.cap_mb,
            "params": param_count(GPTConfig(n_layer=args.depth_speed, n_embd=args.speed_width,
                                            n_head=args.speed_width // 64)),
            "rounds": args.rounds, "steps": args.steps, "settings": out, "load": loads}


def capacity_rows(labs: list[dict]) -> list[str]:
    """Every run of the capacity grid: the estimates and what happened."""
    lines = ["| hosts | depth | width | params | DDP est. MiB | DDP | sharded est. MiB | sharded |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(r):
        if r is None:
            return "-"
        if r["ok"]:
            return f"trains (peak RSS {max(r['peak_rss_mib'])} MiB)"
        return "OOM-killed" if r["killed"] else "failed"

    for lab in labs:
        for r in lab["rows"]:
            lines.append(f"| {lab['hosts']} | {lab.get('depth', 4)} | {r['width']} | "
                         f"{r['params'] / 1e6:.1f}M | {r['ddp_estimate_mib']} | {cell(r.get('ddp'))} | "
                         f"{r['shard_estimate_mib']} | {cell(r.get('shard'))} |")
    return lines


def capacity_summary(labs: list[dict]) -> list[str]:
    """One line a lab: the largest model of each layout, their ratio, and the step times where both fit."""
    lines = []
    best_ddp = max(lab["largest_params"]["ddp"] for lab in labs)
    for lab in labs:
        big = lab["largest_params"]
        ratio = f"{lab['largest_ratio']:.2f}x" if lab["largest_ratio"] else "-"
        st = f"{lab['step_time_ratio']:.2f}x" if lab["step_time_ratio"] else "-"
        runs = lab["tokens_per_sec"]
        med = {m: f"{statistics.median(v):,.0f} ({min(v):,.0f}-{max(v):,.0f})" if v else "-"
               for m, v in runs.items()}
        lines.append(f"- {lab['hosts']} hosts capped at {lab['cap_mib']} MiB, depth {lab.get('depth', 4)}: "
                     f"largest model DDP {big['ddp'] / 1e6:.1f}M, sharded {big['shard'] / 1e6:.1f}M "
                     f"({ratio}; {big['shard'] / best_ddp:.2f}x the largest DDP model of any depth here, "
                     f"{best_ddp / 1e6:.1f}M); at width {lab['speed_width']}, batch {BATCH} x sequence "
                     f"{SEQ}, sharded step time {st} DDP's (median tokens/s of {len(runs['ddp'])} "
                     f"interleaved rounds, min-max: DDP {med['ddp']}, sharded {med['shard']})"
                     + (f"; load average {lab['load'][0]} -> {lab['load'][-1]}" if lab.get("load") else ""))
    return lines


def speed_rows(speed: dict) -> list[str]:
    """The speed study: every variant at every batch x sequence, median (min-max) of its rounds."""
    lines = [f"Where both fit: {speed['hosts']} hosts capped at {speed['cap_mib']} MiB, depth "
             f"{speed['depth']}, width {speed['width']} ({speed['params'] / 1e6:.1f}M parameters), "
             f"{speed['rounds']} interleaved rounds of {speed['steps']} steps (the first untimed), load "
             f"average {speed['load'][0]} -> {speed['load'][-1]}; median (min-max); tokens/s of both ranks, "
             "collectives: rank 0's per step.",
             "", "| batch x seq | layout | tokens/s | step ms | vs DDP | collectives ms | exposed ms | "
             "MB a step | peak RSS MiB |", "|---|---|---|---|---|---|---|---|---|"]

    def mm(s):
        return "-" if s["median"] is None else f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"

    for key, per in speed["settings"].items():
        for v, r in per.items():
            vs = f"{r['step_time_vs_ddp']:.2f}x" if r["step_time_vs_ddp"] else "-"
            mb = f"{r['comm_bytes'] / 1e6:,.0f}" if r["comm_bytes"] else "-"
            lines.append(f"| {key} | {v} | {mm(r['tokens_per_sec'])} | {mm(r['step_ms'])} | {vs} | "
                         f"{mm(r['comm_ms'])} | {mm(r['exposed_ms'])} | {mb} | {r['peak_rss_mib']} |")
    return lines


def table(labs: list[dict], speed: dict | None) -> str:
    lines = [*capacity_rows(labs), "", *capacity_summary(labs)]
    if speed:
        lines += ["", *speed_rows(speed)]
    return "\n".join(lines) + "\n"


def plot(labs: list[dict], speed: dict | None, path: Path) -> None:
    """Left: each run's peak RSS against its parameters (crosses: OOM-killed), the cap; right: the speed
    study's step time against DDP's per variant, median with min-max bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2 if speed else 1, figsize=(13 if speed else 7, 4.6), squeeze=False)
    ax = axes[0][0]
    for lab in labs:
        for mode, marker in (("ddp", "o"), ("shard", "s")):
            ok = [(r["params"] / 1e6, max(r[mode]["peak_rss_mib"])) for r in lab["rows"]
                  if r.get(mode, {}).get("ok")]
            dead = [r["params"] / 1e6 for r in lab["rows"] if r.get(mode) and not r[mode]["ok"]]
            name = (f"{'DDP' if mode == 'ddp' else 'sharded'}, {lab['hosts']} hosts, "
                    f"depth {lab.get('depth', 4)}")
            line = ax.plot(*zip(*ok, strict=True), marker + "-", label=name)[0] if ok else None
            if dead:
                ax.plot(dead, [lab["cap_mib"]] * len(dead), "x", ms=11, mew=2,
                        color=line.get_color() if line else None,
                        label=f"{name}: OOM-killed")
    ax.axhline(labs[0]["cap_mib"], color="k", ls="--", lw=1, label=f"cap per host ({labs[0]['cap_mib']} MiB)")
    ax.set_xlabel("model parameters (M)")
    ax.set_ylabel("peak RSS of a rank (MiB)")
    ax.set_title("Largest model each layout trains")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    if speed:
        ax = axes[0][1]
        keys = list(speed["settings"])
        variants = list(next(iter(speed["settings"].values())))
        w = 0.8 / len(variants)
        for i, v in enumerate(variants):
            ys, lo, hi = [], [], []
            for k in keys:
                r = speed["settings"][k][v]
                ddp = speed["settings"][k]["ddp"]["step_ms"]["median"]
                s = r["step_ms"]
                ys.append(s["median"] / ddp if ddp and s["median"] else 0)
                lo.append((s["median"] - s["min"]) / ddp if ddp and s["median"] else 0)
                hi.append((s["max"] - s["median"]) / ddp if ddp and s["median"] else 0)
            ax.bar([j + i * w for j in range(len(keys))], ys, w, yerr=[lo, hi], capsize=3, label=v)
        ax.axhline(1.5, color="r", ls="--", lw=1, label="target: 1.5x DDP")
        ax.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))], [f"batch x seq {k}" for k in keys])
        ax.set_ylabel("step time / DDP's (median, min-max)")
        ax.set_title(f"Where both fit: {speed['params'] / 1e6:.1f}M params, {speed['hosts']} hosts")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", type=int, nargs="*", default=[2])
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--cap-mb", type=int, default=1100)
    p.add_argument("--widths", type=int, nargs="+", default=[640, 704, 768, 832, 896, 960, 1024])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--speed-hosts", type=int, default=0, help="run the speed study on this many hosts")
    p.add_argument("--depth-speed", type=int, default=4)
    p.add_argument("--speed-width", type=int, default=512)
    p.add_argument("--speed-tokens", nargs="+", default=["1x32", "8x128"], help="batch x sequence")
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", default=str(REPO / "bench" / "results" / "shard"))
    args = p.parse_args()
    out = Path(args.out)
    old = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    root = Path(tempfile.mkdtemp(prefix="ddplab-bench-shard-", dir="/var/tmp"))  # ours alone to remove
    try:
        prepare(root / "data", None, 64, 4, 4, seed=0)
        labs = [bench_lab(n, args, root) for n in args.hosts]
        speed = bench_speed(args.speed_hosts, args, root) if args.speed_hosts else old.get("speed")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    labs = sorted([lab for lab in old.get("labs", []) if lab["hosts"] not in args.hosts] + labs,
                  key=lambda lab: lab["hosts"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"labs": labs, "speed": speed, "args": vars(args)},
                                                 indent=2) + "\n")
    (out / "table.md").write_text(table(labs, speed))
    plot(labs, speed, out / "shard.png")
    print(table(labs, speed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
