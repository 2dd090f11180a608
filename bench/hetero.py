"""Balanced DDP across unequal nodes (issue 15): a full-speed host and one at half a core.

    sudo SIMLAN_LAB=4 .venv/bin/python bench/hetero.py [--rounds 3] [--steps 30] [--id ID] [--priority]

On 2 simulated hosts pinned to their own core (`--cpus auto`), node1 limited to 50 % of its core
(`--cpu-quota node1=50`; node0 gets `node0=100`, its whole core, so both hosts have a cgroup), runs the
same model and global batch (64 sequences of 128 tokens per step) as
  solo-node0, solo-node1   one host alone: --batch-size 32 --grad-accum 2 (the whole global batch)
  uniform                  DDP, 32 sequences per rank per step
  balanced                 DDP with --balance (shares follow each rank's measured speed)
in interleaved rounds (every configuration once per round), and writes runs/bench-hetero-<id>/:
raw/<round>/<config>/ (each host's trainer out dir and log), report.json, report.md, hetero.png; the
report is copied to bench/results/hetero/.

tokens/s: the trainer's own (global tokens per step / step time), after --timing-warmup-steps (the
balanced run's shares settle within them). Validation loss: the data has no validation split yet, so
a held-out shard folder of documents generated with another seed is evaluated with each run's final
checkpoint; every run trains the same number of tokens (steps x global batch), so the losses are at
equal tokens. Each run records the load average and how often node1's cgroup was throttled (a quota
that never throttled did not bind: the machine was too busy for the limit to matter).

--priority raises the cpu weight of the lab's cgroup (`cpu.shares` 20480, as simlan/README.md did for
its quota measurement) so other work on the machine does not take the hosts' cores; it is put back at
the end. Needs root (simlan).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scaling_lab import run_in_hosts  # noqa: E402

MODEL = ["--depth", "2", "--seq-len", "128", "--threads", "1", "--log-every", "5", "--check-every", "0",
         "--straggler-every", "10", "--pg-timeout-s", "300", "--lr", "3e-3"]
PER_RANK, SEQ_LEN = 32, 128  # sequences per rank in uniform DDP
GLOBAL_SEQS = 2 * PER_RANK
CONFIGS = ("solo-node0", "solo-node1", "uniform", "balanced")
MASTER_PORT = 29641
RUN_TIMEOUT_S = 900
QUOTA = {"node0": 100, "node1": 50}
HIGH_SHARES = "20480"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def node_env() -> list[str]:
    return ["env", f"PYTHONPATH={REPO}", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "PYTHONUNBUFFERED=1",
            "GLOO_SOCKET_IFNAME=eth0", "TORCH_CPP_LOG_LEVEL=ERROR"]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def throttled(cgroup: str | None) -> dict:
    """nr_periods / nr_throttled / throttled time of a host's cgroup (v1 cpu.stat or v2 cpu.stat)."""
    if not cgroup or not Path(cgroup, "cpu.stat").exists():
        return {}
    out = {}
    for line in Path(cgroup, "cpu.stat").read_text().splitlines():
        k, _, v = line.partition(" ")
        out[k] = int(v)
    return out


def val_loss(ckpt_dir: Path, val_data: Path, batches: int = 8) -> float:
    """Mean loss of the run's final checkpoint on the held-out shards (the same batches for every run)."""
    import torch

    from trainer.data.loader import ShardLoader
    from trainer.data.shards import open_dataset
    from trainer.data.tokenizer import VOCAB_SIZE
    from trainer.model import GPT, GPTConfig

    path = sorted(ckpt_dir.glob("step_*.pt"))[-1]
    state = torch.load(path, weights_only=False, map_location="cpu")
    c = state["config"]
    model = GPT(GPTConfig(vocab_size=VOCAB_SIZE, seq_len=c["seq_len"], n_layer=c["depth"],
                          n_embd=c["n_embd"], n_head=c["n_head"]))
    model.load_state_dict(state["model"])
    model.eval()
    loader = ShardLoader(open_dataset(val_data), 0, 1, GLOBAL_SEQS, c["seq_len"])
    with torch.no_grad():
        losses = [model(*loader.next_batch()).item() for _ in range(batches)]
    return sum(losses) / len(losses)


class Bench:
    def __init__(self, args):
        self.args = args
        venv = REPO / ".venv" / "bin" / "python"
        self.py = str(venv) if venv.exists() else sys.executable
        self.dir = REPO / "runs" / f"bench-hetero-{args.id}"
        self.cluster = None
        self.saved_shares: tuple[Path, str] | None = None

    def up(self):
        from simlan import cluster as simlan

        quotas = [f"{h}={p}" for h, p in QUOTA.items()]
        self.cluster = simlan.up(2, cpus="auto", cpu_quota=quotas, force=True)
        if self.args.priority:
            lab = Path(self.cluster.host("node1").cgroup).parent
            if (lab / "cpu.shares").exists():
                self.saved_shares = (lab / "cpu.shares", (lab / "cpu.shares").read_text().strip())
                (lab / "cpu.shares").write_text(HIGH_SHARES)
            elif (lab / "cpu.weight").exists():
                self.saved_shares = (lab / "cpu.weight", (lab / "cpu.weight").read_text().strip())
                (lab / "cpu.weight").write_text("10000")

    def down(self):
        if self.saved_shares:
            path, value = self.saved_shares
            if path.exists():
                path.write_text(value)
        if not self.args.keep_cluster:
            from simlan import cluster as simlan

            simlan.down()

    def data(self):
        from trainer.data.shards import prepare

        self.train_data, self.val_data = self.dir / "data" / "train", self.dir / "data" / "val"
        print(prepare(self.train_data, None, 4096, 64, 16, seed=0), flush=True)
        print(prepare(self.val_data, None, 256, 64, 4, seed=12345), flush=True)

    def run_hosts(self, argv_for, names, rdir: Path):
        run_in_hosts(self.cluster, argv_for, names, rdir, RUN_TIMEOUT_S)

    def run(self, config: str, rnd: int) -> dict:
        rdir = self.dir / "raw" / f"round{rnd}" / config
        if rdir.exists():
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        base = ["-m", "trainer", "--data", str(self.train_data), "--steps", str(self.args.steps), *MODEL,
                "--timing-warmup-steps", str(self.args.warmup), "--run-id", f"hetero-{config}-{rnd}"]
        cg = self.cluster.host("node1").cgroup
        before = {"load": load(), "node1_cpu_stat": throttled(cg)}
        t0 = time.monotonic()
        if config.startswith("solo-"):
            host = config.split("-", 1)[1]
            names = [host]
            self.run_hosts(lambda i: [*node_env(), self.py, *base, "--batch-size", str(PER_RANK),
                                      "--grad-accum", "2", "--out", str(rdir / host)], names, rdir)
        else:
            names = ["node0", "node1"]
            master = self.cluster.host("node0").addr
            extra = (["--balance", "--balance-every", str(self.args.balance_every)] if config == "balanced"
                     else [])

            def argv(i):
                return [*node_env(), self.py, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={i}",
                        "--nproc-per-node=1", f"--master-addr={master}", f"--master-port={MASTER_PORT}",
                        "--rdzv-conf=timeout=120", "--max-restarts=0", *base, "--batch-size", str(PER_RANK),
                        *extra, "--out", str(rdir / names[i])]

            self.run_hosts(argv, names, rdir)
        after = throttled(cg)
        s = json.loads((rdir / names[0] / "summary.json").read_text())
        res = {"config": config, "round": rnd, "tokens_per_sec": s["tokens_per_sec"],
               "step_ms_p50": s["step_ms_p50"], "wall_s": round(time.monotonic() - t0, 1),
               "load_before": before["load"], "load_after": load(),
               "node1_throttled_periods": after.get("nr_throttled", 0) -
               before["node1_cpu_stat"].get("nr_throttled", 0),
               "node1_periods": after.get("nr_periods", 0) - before["node1_cpu_stat"].get("nr_periods", 0),
               "val_loss": val_loss(rdir / names[0] / "ckpt", self.val_data),
               "ranks": [{k: r.get(k) for k in ("host", "tokens_per_sec", "step_ms_p50", "compute_ms_p50",
                                                 "wait_ms_p50", "share_last")} for r in s["ranks"]],
               "balance": s.get("balance")}
        (rdir / "result.json").write_text(json.dumps(res, indent=2) + "\n")
        print(f"[{time.strftime('%H:%M:%S')}] round {rnd} {config}: {res['tokens_per_sec']:.0f} tok/s, "
              f"step p50 {res['step_ms_p50']:.0f} ms, val loss {res['val_loss']:.4f}, load "
              f"{res['load_before']}, node1 throttled {res['node1_throttled_periods']}/"
              f"{res['node1_periods']} periods"
              + (f", shares {s['balance']['shares']}" if s.get("balance") else ""), flush=True)
        return res

    def main(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data()
        results = []
        self.up()
        try:
            for rnd in range(1, self.args.rounds + 1):
                for config in CONFIGS:
                    results.append(self.run(config, rnd))
                    (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        finally:
            self.down()
        report = summarize(results, self.args)
        write_report(self.dir, report)
        dest = REPO / "bench" / "results" / "hetero"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "report.md", "hetero.png"):
            shutil.copy2(self.dir / name, dest / name)
        print((self.dir / "report.md").read_text())
        return 0


def summarize(results: list[dict], args) -> dict:
    by = {c: [r for r in results if r["config"] == c] for c in CONFIGS}
    tps = {c: spread([r["tokens_per_sec"] for r in rs]) for c, rs in by.items()}
    vl = {c: spread([r["val_loss"] for r in rs]) for c, rs in by.items()}
    solo_sum = tps["solo-node0"]["median"] + tps["solo-node1"]["median"]
    loads = [x for r in results for x in (r["load_before"][0], r["load_after"][0])]
    return {
        "solo": {"node0": tps["solo-node0"]["median"], "node1": tps["solo-node1"]["median"]},
        "uniform": tps["uniform"]["median"], "balanced": tps["balanced"]["median"],
        "uniform_val_loss": vl["uniform"]["median"], "balanced_val_loss": vl["balanced"]["median"],
        "balanced_over_solo_sum": tps["balanced"]["median"] / solo_sum,
        "uniform_over_solo_sum": tps["uniform"]["median"] / solo_sum,
        "val_loss_balanced_vs_uniform": vl["balanced"]["median"] / vl["uniform"]["median"] - 1,
        "tokens_per_sec": tps, "val_loss": vl,
        "final_shares": [r["balance"]["shares"] for r in by["balanced"]],
        "per_rank": {c: per_rank(by[c]) for c in ("uniform", "balanced")},
        "node1_throttled_fraction": {c: (sum(r["node1_throttled_periods"] for r in rs) /
                                         max(1, sum(r["node1_periods"] for r in rs))) for c, rs in by.items()
                                     if c != "solo-node0"},
        "load_1min": spread(loads),
        "setup": {"hosts": "2 simlan hosts, --cpus auto (one core each)", "cpu_quota": QUOTA,
                  "priority": args.priority, "rounds": args.rounds, "steps": args.steps,
                  "timing_warmup_steps": args.warmup, "balance_every": args.balance_every,
                  "global_batch": f"{GLOBAL_SEQS} x {SEQ_LEN} tokens", "model": " ".join(MODEL),
                  "val": "held-out shard folder (256 generated docs, seed 12345; no validation split yet), "
                         "8 batches of the global batch size, final checkpoint of each run"},
        "runs": results,
    }


def per_rank(runs: list[dict]) -> list[dict]:
    """Each rank's share, compute and wait ms per step (median over the rounds of the run's p50s)."""
    out = []
    for i, first in enumerate(runs[0]["ranks"]):
        ranks = [r["ranks"][i] for r in runs]
        keys = ("share_last", "compute_ms_p50", "wait_ms_p50")
        out.append({"host": first["host"], **{k: statistics.median(x[k] for x in ranks) for k in keys}})
    return out


def write_report(d: Path, rep: dict) -> None:
    t, v = rep["tokens_per_sec"], rep["val_loss"]

    def row(c, label):
        return (f"| {label} | {t[c]['median']:.0f} | {t[c]['min']:.0f}-{t[c]['max']:.0f} | "
                f"{v[c]['median']:.4f} | {v[c]['min']:.4f}-{v[c]['max']:.4f} |")

    s = rep["setup"]
    lines = [
        "# Balanced DDP across unequal nodes (bench/hetero.py)", "",
        f"- hosts: {s['hosts']}, quota {s['cpu_quota']} (percent of one core); cgroup priority raised: "
        f"{s['priority']}",
        f"- model: `{s['model']}`, global batch {s['global_batch']}, {s['steps']} steps, first "
        f"{s['timing_warmup_steps']} untimed; --balance-every {s['balance_every']}",
        f"- {s['rounds']} interleaved rounds; medians with min-max; load average (1 min) over the runs "
        f"{rep['load_1min']['min']:.1f}-{rep['load_1min']['max']:.1f} (median "
        f"{rep['load_1min']['median']:.1f})",
        "- node1 throttled in "
        f"{', '.join(f'{c} {f:.0%}' for c, f in rep['node1_throttled_fraction'].items())}"
        " of its cgroup periods (0 %: the quota did not bind)",
        f"- validation: {s['val']}", "",
        "| run | tokens/s | min-max | val loss | min-max |", "|---|---|---|---|---|",
        row("solo-node0", "node0 alone"), row("solo-node1", "node1 alone (50 %)"),
        row("uniform", "uniform DDP"), row("balanced", "balanced DDP (--balance)"), "",
        f"- sum of solos: {rep['solo']['node0'] + rep['solo']['node1']:.0f} tok/s; uniform "
        f"{rep['uniform_over_solo_sum']:.2f}x, balanced {rep['balanced_over_solo_sum']:.2f}x "
        "(target >= 0.90x)",
        f"- val loss balanced vs uniform: {rep['val_loss_balanced_vs_uniform']:+.2%} (target within 2 %)",
        f"- final shares of the balanced runs (node0, node1 sequences of {GLOBAL_SEQS}): "
        f"{rep['final_shares']}",
        "", "Per rank (median over the rounds): sequences per step at the end, compute and wait ms per step "
        "(wait = the exposed all-reduce, where a rank waits for the slower one)", "",
        "| run | host | share | compute ms | wait ms |", "|---|---|---|---|---|",
        *[f"| {c} | {r['host']} | {r['share_last']:g} | {r['compute_ms_p50']:.0f} | {r['wait_ms_p50']:.0f} |"
          for c, ranks in rep["per_rank"].items() for r in ranks],
        "", "![throughput](hetero.png)", ""]
    (d / "report.md").write_text("\n".join(lines))
    (d / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    plot(d / "hetero.png", rep)


def plot(path: Path, rep: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = rep["tokens_per_sec"]
    labels = ["node0\nalone", "node1\nalone (50 %)", "uniform\nDDP", "balanced\nDDP"]
    med = [t[c]["median"] for c in CONFIGS]
    err = [[m - t[c]["min"] for m, c in zip(med, CONFIGS, strict=True)],
           [t[c]["max"] - m for m, c in zip(med, CONFIGS, strict=True)]]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(labels, med, yerr=err, capsize=4, color=["#888", "#bbb", "#d62728", "#2ca02c"])
    total = rep["solo"]["node0"] + rep["solo"]["node1"]
    ax.axhline(total, ls="--", color="k", lw=1, label=f"sum of solos {total:.0f}")
    ax.axhline(0.9 * total, ls=":", color="g", lw=1, label="0.90 x sum")
    ax.set_ylabel("tokens/s (median, min-max)")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10, help="untimed first steps of every run")
    p.add_argument("--balance-every", type=int, default=3)
    p.add_argument("--id", default=time.strftime("%Y%m%d-%H%M%S"))
    p.add_argument("--priority", action="store_true",
                   help="raise the lab cgroup's cpu weight during the runs")
    p.add_argument("--keep-cluster", action="store_true")
    p.add_argument("--rebuild", metavar="DIR", help="only rewrite report.* from DIR/results.json")
    args = p.parse_args(argv)
    if os.environ.get("SIMLAN_LAB") is None:
        print("bench/hetero.py: note: SIMLAN_LAB is not set: lab 0", file=sys.stderr)
    if args.rebuild:
        d = Path(args.rebuild)
        write_report(d, summarize(json.loads((d / "results.json").read_text()), args))
        print((d / "report.md").read_text())
        return 0
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
