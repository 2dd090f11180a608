"""Balanced DDP across unequal nodes (issue 15): full-speed hosts and a slow one.

    sudo SIMLAN_LAB=4 .venv/bin/python bench/hetero.py [--case 2|3] [--rounds 3] [--steps 30] [--priority]

Case 2: 2 simulated hosts pinned to their own core (`--cpus auto`), node1 limited to 50 % of its core
(`--cpu-quota node1=50`; node0 gets `node0=100`, its whole core, so both hosts have a cgroup).
Case 3: the issue's 100 %, 100 %, 35 % lab, scaled to fit 2 cores: 60 %, 60 %, 21 % (node0 and node2
share core 0, node1 has core 1; 81 % and 60 % of the cores, room left for sshd and the control side).
Every case runs the same model and global batch (32 sequences of 128 tokens per host per step) as
  solo-<host>   one host alone: --batch-size 32 --grad-accum <hosts> (the whole global batch)
  uniform       DDP, 32 sequences per rank per step
  balanced      DDP with --balance (shares follow each rank's measured speed)
in interleaved rounds (every configuration once per round), and writes runs/bench-hetero<case>-<id>/:
raw/<round>/<config>/ (each host's trainer out dir and log), report.json, report.md, hetero.png; the
report is copied to bench/results/hetero/ (case 2) or bench/results/hetero3/ (case 3).

tokens/s: the trainer's own (global tokens per step / step time), after --timing-warmup-steps (the
balanced run's shares settle within them). Validation loss: the data has no validation split yet, so
a held-out shard folder of documents generated with another seed is evaluated with each run's final
checkpoint; every run trains the same number of tokens (steps x global batch), so the losses are at
equal tokens. Each run records the load average and how often each host's cgroup was throttled (a quota
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

from bench.scaling_lab import machine_info, run_in_hosts  # noqa: E402

MODEL = ["--depth", "2", "--seq-len", "128", "--threads", "1", "--log-every", "5", "--check-every", "0",
         "--straggler-every", "10", "--pg-timeout-s", "300", "--lr", "3e-3"]
PER_RANK, SEQ_LEN = 32, 128  # sequences per rank in uniform DDP
MASTER_PORT = 29641
RUN_TIMEOUT_S = 900
# host -> percent of one core; case 3 is (100, 100, 35) x 0.6 so that it fits 2 cores
CASES = {"2": {"node0": 100, "node1": 50}, "3": {"node0": 60, "node1": 60, "node2": 21}}
RESULTS = {"2": "hetero", "3": "hetero3"}


def configs(quota: dict) -> list[str]:
    return [*(f"solo-{h}" for h in quota), "uniform", "balanced"]
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


def val_loss(ckpt_dir: Path, val_data: Path, batches: int = 8, batch: int = 64) -> float:
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
    loader = ShardLoader(open_dataset(val_data), 0, 1, batch, c["seq_len"])
    with torch.no_grad():
        losses = [model(*loader.next_batch()).item() for _ in range(batches)]
    return sum(losses) / len(losses)


class Bench:
    def __init__(self, args):
        self.args = args
        venv = REPO / ".venv" / "bin" / "python"
        self.py = str(venv) if venv.exists() else sys.executable
        self.quota = CASES[args.case]
        self.hosts = list(self.quota)
        self.dir = REPO / "runs" / f"bench-hetero{'' if args.case == '2' else args.case}-{args.id}"
        self.cluster = None
        self.saved_shares: tuple[Path, str] | None = None

    def up(self):
        from simlan import cluster as simlan

        quotas = [f"{h}={p}" for h, p in self.quota.items()]
        self.cluster = simlan.up(len(self.hosts), cpus="auto", cpu_quota=quotas, force=True)
        if self.args.priority:
            lab = Path(self.cluster.host(self.hosts[-1]).cgroup).parent
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
        n = len(self.hosts)
        base = ["-m", "trainer", "--data", str(self.train_data), "--steps", str(self.args.steps), *MODEL,
                "--timing-warmup-steps", str(self.args.warmup), "--run-id", f"hetero-{config}-{rnd}"]
        cgroups = {h: self.cluster.host(h).cgroup for h in self.hosts}
        before = {"load": load(), "cpu_stat": {h: throttled(cg) for h, cg in cgroups.items()}}
        t0 = time.monotonic()
        if config.startswith("solo-"):
            names = [config.split("-", 1)[1]]
            self.run_hosts(lambda i: [*node_env(), self.py, *base, "--batch-size", str(PER_RANK),
                                      "--grad-accum", str(n), "--out", str(rdir / names[0])], names, rdir)
        else:
            names = self.hosts
            master = self.cluster.host(names[0]).addr
            extra = (["--balance", "--balance-every", str(self.args.balance_every)] if config == "balanced"
                     else [])

            def argv(i):
                return [*node_env(), self.py, "-m", "torch.distributed.run", f"--nnodes={n}",
                        f"--node-rank={i}", "--nproc-per-node=1", f"--master-addr={master}",
                        f"--master-port={MASTER_PORT}", "--rdzv-conf=timeout=120", "--max-restarts=0", *base,
                        "--batch-size", str(PER_RANK), *extra, "--out", str(rdir / names[i])]

            self.run_hosts(argv, names, rdir)
        s = json.loads((rdir / names[0] / "summary.json").read_text())
        # how often each used host's quota bound (cgroup periods in which it was throttled)
        throttle = {}
        for h in names:
            after, was = throttled(cgroups[h]), before["cpu_stat"][h]
            throttle[h] = [after.get("nr_throttled", 0) - was.get("nr_throttled", 0),
                           after.get("nr_periods", 0) - was.get("nr_periods", 0)]
        res = {"config": config, "round": rnd, "tokens_per_sec": s["tokens_per_sec"],
               "step_ms_p50": s["step_ms_p50"], "wall_s": round(time.monotonic() - t0, 1),
               "load_before": before["load"], "load_after": load(), "throttled": throttle,
               "val_loss": val_loss(rdir / names[0] / "ckpt", self.val_data, batch=n * PER_RANK),
               "ranks": [{k: r.get(k) for k in ("host", "tokens_per_sec", "step_ms_p50", "compute_ms_p50",
                                                 "wait_ms_p50", "share_last")} for r in s["ranks"]],
               "balance": s.get("balance")}
        (rdir / "result.json").write_text(json.dumps(res, indent=2) + "\n")
        print(f"[{time.strftime('%H:%M:%S')}] round {rnd} {config}: {res['tokens_per_sec']:.0f} tok/s, "
              f"step p50 {res['step_ms_p50']:.0f} ms, val loss {res['val_loss']:.4f}, load "
              f"{res['load_before']}, throttled periods "
              f"{', '.join(f'{h} {t}/{p}' for h, (t, p) in throttle.items())}"
              + (f", shares {s['balance']['shares']}" if s.get("balance") else ""), flush=True)
        return res

    def main(self) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data()
        results = []
        self.up()
        try:
            for rnd in range(1, self.args.rounds + 1):
                for config in configs(self.quota):
                    results.append(self.run(config, rnd))
                    (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        finally:
            self.down()
        report = summarize(results, self.args) | {"machine": machine_info()}
        write_report(self.dir, report)
        dest = REPO / "bench" / "results" / RESULTS[self.args.case]
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "report.md", "hetero.png"):
            shutil.copy2(self.dir / name, dest / name)
        print((self.dir / "report.md").read_text())
        return 0


def summarize(results: list[dict], args) -> dict:
    """Medians with min-max per configuration; the ratios to the sum of the solos are taken within each
    round (the configurations of a round ran back to back), then summarized the same way."""
    quota = CASES[args.case]
    hosts, confs = list(quota), configs(quota)
    by = {c: [r for r in results if r["config"] == c] for c in confs}
    tps = {c: spread([r["tokens_per_sec"] for r in rs]) for c, rs in by.items()}
    vl = {c: spread([r["val_loss"] for r in rs]) for c, rs in by.items()}
    rounds = sorted({r["round"] for r in results})
    per_round = {(r["round"], r["config"]): r for r in results}
    complete = [k for k in rounds if all((k, c) in per_round for c in confs)]
    ratio = {}
    for mode in ("uniform", "balanced"):
        ratio[mode] = spread([per_round[(k, mode)]["tokens_per_sec"] /
                              sum(per_round[(k, f"solo-{h}")]["tokens_per_sec"] for h in hosts)
                              for k in complete])
    loads = [x for r in results for x in (r["load_before"][0], r["load_after"][0])]
    return {
        "solo": {h: tps[f"solo-{h}"]["median"] for h in hosts},
        "uniform": tps["uniform"]["median"], "balanced": tps["balanced"]["median"],
        "uniform_val_loss": vl["uniform"]["median"], "balanced_val_loss": vl["balanced"]["median"],
        "balanced_over_solo_sum": ratio["balanced"]["median"],
        "uniform_over_solo_sum": ratio["uniform"]["median"], "over_solo_sum": ratio,
        "val_loss_balanced_vs_uniform": vl["balanced"]["median"] / vl["uniform"]["median"] - 1,
        "tokens_per_sec": tps, "val_loss": vl,
        "final_shares": [r["balance"]["shares"] for r in by["balanced"]],
        "per_rank": {c: per_rank(by[c]) for c in ("uniform", "balanced")},
        "throttled_fraction": throttled_fraction(results, quota),
        "load_1min": spread(loads),
        "setup": {"case": args.case, "cpu_quota": quota, "priority": args.priority, "rounds": len(complete),
                  "hosts": f"{len(hosts)} simlan hosts, --cpus auto (host i on core i % 2)",
                  "steps": args.steps, "timing_warmup_steps": args.warmup,
                  "balance_every": args.balance_every,
                  "global_batch": f"{len(hosts) * PER_RANK} x {SEQ_LEN} tokens", "model": " ".join(MODEL),
                  "val": "held-out shard folder (256 generated docs, seed 12345), 8 batches of the global "
                         "batch size, final checkpoint of each run"},
        "runs": results,
    }


def throttled_fraction(results: list[dict], quota: dict) -> dict:
    """Per host below a full core: the share of its cgroup periods in which the quota bound, summed over
    the runs it took part in (0 %: the limit did not bind, the machine was too busy for it to matter)."""
    out = {}
    for h, pct in quota.items():
        if pct >= 100:
            continue
        t = sum(r["throttled"][h][0] for r in results if h in r["throttled"])
        n = sum(r["throttled"][h][1] for r in results if h in r["throttled"])
        out[h] = t / max(1, n)
    return out


def per_rank(runs: list[dict]) -> list[dict]:
    """Each rank's share, compute and wait ms per step (median over the rounds of the run's p50s)."""
    out = []
    for i, first in enumerate(runs[0]["ranks"]):
        ranks = [r["ranks"][i] for r in runs]
        keys = ("share_last", "compute_ms_p50", "wait_ms_p50")
        out.append({"host": first["host"], **{k: statistics.median(x[k] for x in ranks) for k in keys}})
    return out


def labels(quota: dict) -> dict:
    return {**{f"solo-{h}": f"{h} alone ({p} %)" for h, p in quota.items()},
            "uniform": "uniform DDP", "balanced": "balanced DDP (--balance)"}


def write_report(d: Path, rep: dict) -> None:
    t, v, s = rep["tokens_per_sec"], rep["val_loss"], rep["setup"]
    quota = s["cpu_quota"]
    names = labels(quota)

    def row(c):
        return (f"| {names[c]} | {t[c]['median']:.0f} | {t[c]['min']:.0f}-{t[c]['max']:.0f} | "
                f"{v[c]['median']:.4f} | {v[c]['min']:.4f}-{v[c]['max']:.4f} |")

    def ratio(mode):
        r = rep["over_solo_sum"][mode]
        return f"{r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f})"

    lines = [
        f"# Balanced DDP across unequal nodes, {len(quota)} hosts (bench/hetero.py --case {s['case']})", "",
        f"- hosts: {s['hosts']}, quota {quota} (percent of one core); cgroup priority raised: "
        f"{s['priority']}",
        f"- model: `{s['model']}`, global batch {s['global_batch']}, {s['steps']} steps, first "
        f"{s['timing_warmup_steps']} untimed; --balance-every {s['balance_every']}",
        *([f"- machine: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs, torch {m.get('torch')}"]
          if (m := rep.get("machine")) else []),
        f"- {s['rounds']} interleaved rounds; medians with min-max; load average (1 min) over the runs "
        f"{rep['load_1min']['min']:.1f}-{rep['load_1min']['max']:.1f} (median "
        f"{rep['load_1min']['median']:.1f})",
        "- quota bound (throttled cgroup periods): "
        f"{', '.join(f'{h} {f:.0%}' for h, f in rep['throttled_fraction'].items())} (0 %: it did not bind)",
        f"- validation: {s['val']}", "",
        "| run | tokens/s | min-max | val loss | min-max |", "|---|---|---|---|---|",
        *[row(c) for c in configs(quota)], "",
        f"- sum of solos: {sum(rep['solo'].values()):.0f} tok/s (medians); within each round: uniform "
        f"{ratio('uniform')}, balanced {ratio('balanced')} of that round's sum (target >= 0.90x)",
        f"- val loss balanced vs uniform: {rep['val_loss_balanced_vs_uniform']:+.2%} (target within 2 %)",
        f"- final shares of the balanced runs ({', '.join(quota)}; sequences of "
        f"{len(quota) * PER_RANK}): {rep['final_shares']}",
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

    t, quota = rep["tokens_per_sec"], rep["setup"]["cpu_quota"]
    confs = configs(quota)
    names = [labels(quota)[c].replace(" (", "\n(").replace(" DDP", "\nDDP") for c in confs]
    med = [t[c]["median"] for c in confs]
    err = [[m - t[c]["min"] for m, c in zip(med, confs, strict=True)],
           [t[c]["max"] - m for m, c in zip(med, confs, strict=True)]]
    fig, ax = plt.subplots(figsize=(2 + 1.4 * len(confs), 4))
    ax.bar(names, med, yerr=err, capsize=4, color=["#888"] * len(quota) + ["#d62728", "#2ca02c"])
    total = sum(rep["solo"].values())
    ax.axhline(total, ls="--", color="k", lw=1, label=f"sum of solos {total:.0f}")
    ax.axhline(0.9 * total, ls=":", color="g", lw=1, label="0.90 x sum")
    ax.set_ylabel("tokens/s (median, min-max)")
    ax.set_title(f"{len(quota)} hosts at {', '.join(f'{p} %' for p in quota.values())} of a core")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=sorted(CASES), default="2",
                   help="2: node0 100 %%, node1 50 %%; 3: 60/60/21 %% (100/100/35 scaled to 2 cores)")
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
        old = json.loads((d / "report.json").read_text()) if (d / "report.json").exists() else {}
        write_report(d, summarize(json.loads((d / "results.json").read_text()), args) |
                     {"machine": old.get("machine") or machine_info()})
        print((d / "report.md").read_text())
        return 0
    return Bench(args).main()


if __name__ == "__main__":
    sys.exit(main())
