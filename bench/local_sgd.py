"""Low-communication mode on 2 local ranks: per-step all-reduce (--sync-every 1) vs --sync-every 8.

    .venv/bin/python bench/local_sgd.py [--rounds 3] [--steps 96] [--id ID]

Configurations: H1 (DDP, gradients all-reduced every step), H8 (DiLoCo defaults: outer lr 0.7, Nesterov
momentum 0.9), H8-avg (plain parameter averaging every 8 steps: outer lr 1, momentum 0). All train the
same model, batch and number of steps (so the same tokens) with 2 ranks under `torchrun --standalone`
on this machine (loopback, gloo, 1 thread per rank), in interleaved rounds (each configuration once
per round, the order reversed every other round). Per run: tokens/s (the trainer's own, after its
warm-up steps), the held-out loss of the final checkpoint (documents generated with another seed; the
same batches for every run; after the last step every rank holds the synchronized model), the mean
train loss of both ranks over the last 8 steps, and the bytes all-reduced per step. Ratios (each
configuration over H1) are taken within each round, then summarized: median with min-max.

This is loopback, not a slow link: the all-reduce is cheap here, so it measures what the mode costs
or saves in compute and loss, not what it gains on Wi-Fi or 1 GbE. Writes runs/bench-local-sgd-<id>/
(raw out dirs and logs) and bench/results/local_sgd/report.json + report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.hetero import val_loss  # noqa: E402  (held-out loss of a run's final checkpoint)

MODEL = ["--depth", "2", "--seq-len", "128", "--batch-size", "8", "--threads", "1", "--log-every", "8",
         "--check-every", "8", "--lr", "3e-3", "--timing-warmup-steps", "2"]
CONFIGS = {"H1": [], "H8": ["--sync-every", "8", "--allow-local-sgd"],
           "H8-avg": ["--sync-every", "8", "--allow-local-sgd", "--outer-lr", "1", "--outer-momentum", "0"]}
LABELS = {"H1": "--sync-every 1 (DDP, fp32)", "H8": "--sync-every 8, DiLoCo (outer lr 0.7, Nesterov 0.9)",
          "H8-avg": "--sync-every 8, parameter averaging (outer lr 1, momentum 0)"}
RESULTS = REPO / "bench" / "results" / "local_sgd"


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def torchrun_trainer(data: Path, out: Path, argv: list[str], timeout: float = 900) -> dict:
    """`python -m trainer` on 2 local ranks (torchrun --standalone, gloo over loopback, 1 thread per rank),
    its log in OUT.log; returns its summary.json. A failed run stops the bench with one line."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "trainer", "--data", str(data), "--out", str(out), *argv]
    with open(out.parent / f"{out.name}.log", "w") as log:
        r = subprocess.run(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if r.returncode != 0:
        raise SystemExit(f"bench: {out}: trainer exited {r.returncode}; see {out}.log")
    return json.loads((out / "summary.json").read_text())


def run_one(data: Path, out: Path, steps: int, extra: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    s = torchrun_trainer(data, out, ["--steps", str(steps), *MODEL, *extra])
    tail = []
    for rank in (0, 1):
        recs = [json.loads(ln) for ln in (out / f"metrics.rank{rank}.jsonl").read_text().splitlines() if ln]
        tail += [x["loss"] for x in recs[-8:]]
    return {"tokens_per_sec": s["tokens_per_sec"], "val_loss": val_loss(out / "ckpt", data.parent / "val"),
            "train_loss_last8": sum(tail) / len(tail),
            "allreduce_bytes_per_step": s["allreduce_bytes_per_step"],
            "tokens": s["tokens_per_step"] * steps, "params": s["params"], "load1": round(load_before, 2)}


def summarize(runs: list[dict]) -> dict:
    out = {}
    for c in CONFIGS:
        mine = [r for r in runs if r["config"] == c]
        out[c] = {k: spread([r[k] for r in mine]) for k in ("tokens_per_sec", "val_loss", "train_loss_last8")}
        out[c]["allreduce_bytes_per_step"] = mine[0]["allreduce_bytes_per_step"]
    rounds = sorted({r["round"] for r in runs})
    by = {(r["round"], r["config"]): r for r in runs}
    for c in list(CONFIGS)[1:]:
        out[f"{c}_over_H1"] = {k: spread([by[(n, c)][k] / by[(n, "H1")][k] for n in rounds])
                               for k in ("tokens_per_sec", "val_loss")}
    return out


def write_md(rep: dict) -> str:
    s = rep["summary"]

    def f(x, d=0):
        return f"{x['median']:,.{d}f} ({x['min']:,.{d}f}-{x['max']:,.{d}f})"

    lines = [f"# Local SGD / DiLoCo vs per-step all-reduce, 2 local ranks ({rep['when']})", "",
             rep["setup"], "",
             "| config | tokens/s | held-out loss | train loss, last 8 steps | all-reduce bytes/step |",
             "|---|---|---|---|---|"]
    for c, label in LABELS.items():
        x = s[c]
        lines.append(f"| {label} | {f(x['tokens_per_sec'])} | {f(x['val_loss'], 4)} | "
                     f"{f(x['train_loss_last8'], 4)} | {x['allreduce_bytes_per_step']:,.0f} |")
    lines.append("")
    for c in list(CONFIGS)[1:]:
        r = s[f"{c}_over_H1"]
        lines.append(f"{c} / H1 within each round: tokens/s {f(r['tokens_per_sec'], 3)}, held-out loss "
                     f"{f(r['val_loss'], 3)} (median (min-max) of {r['tokens_per_sec']['n']} rounds).")
    lines += ["", "Loopback only: the all-reduce is cheap here, so this says what the mode costs in loss and "
              "saves in communication at equal tokens, not its gain on a slow link.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=96)
    ap.add_argument("--id", default=time.strftime("%Y%m%d-%H%M%S"))
    args = ap.parse_args(argv)
    from trainer.data.shards import prepare

    d = REPO / "runs" / f"bench-local-sgd-{args.id}"
    data = d / "data" / "train"
    if not data.exists():
        print(prepare(data, None, 4096, 64, 16, seed=0), flush=True)
        print(prepare(d / "data" / "val", None, 256, 64, 4, seed=12345), flush=True)
    runs = []
    for n in range(args.rounds):
        order = list(CONFIGS) if n % 2 == 0 else list(reversed(CONFIGS))
        for c in order:
            out = d / "raw" / str(n) / c
            out.parent.mkdir(parents=True, exist_ok=True)
            r = run_one(data, out, args.steps, CONFIGS[c]) | {"config": c, "round": n}
            print(f"round {n} {c}: {r['tokens_per_sec']:,.0f} tok/s, held-out loss {r['val_loss']:.4f}, "
                  f"load {r['load1']}", flush=True)
            runs.append(r)
    import torch

    rep = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "runs": runs,
           "summary": summarize(runs),
           "steps": args.steps, "args": MODEL, "configs": CONFIGS, "torch_version": torch.__version__,
           "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
           "load_end": [round(x, 2) for x in os.getloadavg()],
           "setup": (f"2 ranks, torchrun --standalone on one machine ({os.cpu_count()} cores, shared), "
                     f"gloo over loopback, 1 thread per rank; model depth 2 (n_embd 128), "
                     f"{runs[0]['params']:,} params, "
                     f"seq 128, batch 8 per rank, {args.steps} steps = {runs[0]['tokens']:,} tokens per run; "
                     f"{args.rounds} interleaved rounds; torch {torch.__version__}; load average at the "
                     f"start of each run {min(r['load1'] for r in runs)}-{max(r['load1'] for r in runs)}. "
                     f"Held-out loss: final checkpoint on 8 batches of 64 sequences of documents generated "
                     f"with another seed.")}
    RESULTS.mkdir(parents=True, exist_ok=True)
    for where in (d, RESULTS):
        (where / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
        (where / "report.md").write_text(write_md(rep))
    print(write_md(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
