"""tokens/s of ddplab's trainer at 1 rank vs 2 ranks on this machine, against the textbook DDP loop.

    .venv/bin/python bench/trainer_scaling.py [--depth 6] [--seq-len 128] [--batch-size 8] [--steps 20] \
        [--rounds 3]

Each rank is pinned to its own core (taskset) with one thread. The 2-rank runs are launched like two
nodes: one `torchrun --nnodes 2 --nproc-per-node 1` per core, over loopback. Prints a table and writes
bench/results/trainer_scaling.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT")}
    return e | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def launch(entry: list[str], world: int, timeout: int = 900) -> None:
    """Run `entry` (after `python`) with `world` ranks, rank i pinned to core i."""
    py = sys.executable
    if world == 1:
        entry = [a.replace("{node}", "0") for a in entry]
        subprocess.run(["taskset", "-c", "0", py, *entry], cwd=REPO, env=env(), check=True, timeout=timeout,
                       stdout=subprocess.DEVNULL)
        return
    port = free_port()
    procs = []
    for node in range(world):
        args = [a.replace("{node}", str(node)) for a in entry]
        cmd = ["taskset", "-c", str(node), py, "-m", "torch.distributed.run", f"--nnodes={world}",
               f"--node-rank={node}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
               f"--master-port={port}", *args]
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=env(), stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, text=True))
    for p in procs:
        _, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"rank failed: {err[-2000:]}")


def median(v: list[float]) -> float:
    v = sorted(v)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2


def spread(v: list[float]) -> dict:
    """Median with min and max: the numbers this benchmark reports for anything measured per round."""
    return {"median": median(v), "min": min(v), "max": max(v), "values": v}


def run_one(impl: str, world: int, out: Path, data: Path, a) -> dict:
    common = ["--depth", str(a.depth), "--seq-len", str(a.seq_len), "--batch-size", str(a.batch_size),
              "--steps", str(a.steps), "--threads", "1"]
    t0 = time.perf_counter()
    if impl == "trainer":
        launch(["-m", "trainer", "--data", str(data), "--out", f"{out}/node{{node}}", *common,
                "--timing-warmup-steps", str(a.warmup), "--log-every", "1000",
                *a.trainer_args.split()], world)
        s = json.loads((out / "node0" / "summary.json").read_text())
        keys = ("tokens_per_sec", "step_ms_p50", "allreduce_ms_p50", "comm_compute_ratio", "loss_last", "mfu",
                "peak_flops_per_rank")
        res = {k: s.get(k) for k in keys}
    else:
        launch([str(REPO / "bench" / "textbook_ddp.py"), "--data", str(data), *common[:-2],
                "--warmup", str(a.warmup), "--json", f"{out}-node{{node}}.json"], world)
        res = json.loads(Path(f"{out}-node0.json").read_text())
    res["wall_s"] = time.perf_counter() - t0
    return res


def rows_from_runs(runs: dict[tuple[str, int], list[dict]]) -> list[dict]:
    """One row per (impl, ranks) from its runs, one per round in round order: medians with min-max; the
    speed-up over 1 rank and the ratio to the textbook loop are taken within each round."""
    rows = []
    for impl, world in runs:
        rs = runs[(impl, world)]
        tps = [r["tokens_per_sec"] for r in rs]
        row = {"impl": impl, "ranks": world, "tokens_per_sec": median(tps),
               "tokens_per_sec_spread": spread(tps), "step_ms_p50": median([r["step_ms_p50"] for r in rs])}
        one = [r1["tokens_per_sec"] for r1 in runs[(impl, 1)]]
        row["speedup_vs_1rank"] = spread([t / o for t, o in zip(tps, one, strict=True)])
        row["scaling_efficiency"] = row["speedup_vs_1rank"]["median"] / world
        tb = [r["tokens_per_sec"] for r in runs[("textbook", world)]]
        row["vs_textbook"] = spread([t / b for t, b in zip(tps, tb, strict=True)])
        if impl == "trainer":
            row["allreduce_ms_p50"] = median([r.get("allreduce_ms_p50") or 0.0 for r in rs])
            mfu = [r["mfu"] for r in rs if r.get("mfu") is not None]
            row["mfu"] = spread(mfu) if mfu else None
        rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--depth", type=int, default=6, help="width 64*depth (6: 384, ~10.8M parameters)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians with min-max are kept")
    ap.add_argument("--name", default="trainer_scaling", help="result files: bench/results/NAME.json/.png")
    ap.add_argument("--trainer-args", default="", help="extra trainer flags, e.g. '--compile'")
    a = ap.parse_args()
    if a.rounds < 3:
        sys.exit(f"ddplab: error: --rounds {a.rounds}: at least 3 rounds are needed for a median and spread")
    cores = len(os.sched_getaffinity(0))
    if cores < 2:
        sys.exit(f"ddplab: error: this benchmark pins two ranks to two cores; this machine offers {cores}")

    from trainer.data.shards import prepare
    from trainer.model import GPTConfig, param_count

    load0 = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="ddplab-bench-"))
    configs = [(impl, world) for world in (1, 2) for impl in ("trainer", "textbook")]
    runs: dict[tuple[str, int], list[dict]] = {c: [] for c in configs}
    try:
        data = tmp / "shards"
        prepare(data, None, 4096, 64, 16, seed=0)
        # rounds outermost, configurations interleaved and their order rotated each round, so a busy
        # moment on a shared machine does not land on one configuration only
        for rnd in range(a.rounds):
            order = configs[rnd % len(configs):] + configs[:rnd % len(configs)]
            for impl, world in order:
                res = run_one(impl, world, tmp / f"{impl}-{world}-{rnd}", data, a)
                runs[(impl, world)].append(res)
                print(f"  round {rnd + 1}/{a.rounds} {impl:8s} {world} rank(s): "
                      f"{res['tokens_per_sec']:,.0f} tok/s", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    rows = rows_from_runs(runs)
    import torch

    gc = GPTConfig(seq_len=a.seq_len, n_layer=a.depth, n_embd=a.depth * 64, n_head=max(1, a.depth))
    result = {"machine": {"cores": cores, "cpu": _cpu_model(), "torch": torch.__version__,
                          "loadavg_start": load0, "loadavg_end": os.getloadavg()},
              "model": {"depth": a.depth, "n_embd": a.depth * 64, "params": param_count(gc),
                        "seq_len": a.seq_len, "batch_size": a.batch_size, "steps": a.steps,
                        "timing_warmup_steps": a.warmup, "trainer_args": a.trainer_args,
                        "threads_per_rank": 1},
              "rounds": a.rounds, "rows": rows}
    print(f"\nmodel depth {a.depth}, {param_count(gc):,} params, seq {a.seq_len}, batch {a.batch_size}/rank, "
          f"{a.steps} steps ({a.warmup} warm-up), 1 thread per rank, one core per rank; median [min-max] of "
          f"{a.rounds} interleaved rounds; load average {load0[0]:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"{'impl':9s} {'ranks':>5s} {'tok/s [min-max]':>24s} {'speedup':>8s} {'step ms':>8s} "
          f"{'vs textbook [min-max]':>22s}")
    for r in rows:
        t, v = r["tokens_per_sec_spread"], r["vs_textbook"]
        print(f"{r['impl']:9s} {r['ranks']:5d} {t['median']:8,.0f} [{t['min']:,.0f}-{t['max']:,.0f}] "
              f"{r['speedup_vs_1rank']['median']:8.2f} {r['step_ms_p50']:8.1f} "
              f"{v['median']:8.3f} [{v['min']:.3f}-{v['max']:.3f}]")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{a.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    _plot(rows, RESULTS / f"{a.name}.png", result["model"], a.rounds)
    print(f"\nwrote {RESULTS / (a.name + '.json')} and {RESULTS / (a.name + '.png')}")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _plot(rows, path: Path, model: dict, rounds: int):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    w = 0.38
    for i, impl in enumerate(("trainer", "textbook")):
        rs = [r for r in rows if r["impl"] == impl]
        xs = [r["ranks"] - 1 + (i - 0.5) * w for r in rs]
        med = [r["tokens_per_sec"] for r in rs]
        err = [[m - r["tokens_per_sec_spread"]["min"] for m, r in zip(med, rs, strict=True)],
               [r["tokens_per_sec_spread"]["max"] - m for m, r in zip(med, rs, strict=True)]]
        bars = ax.bar(xs, med, w, yerr=err, capsize=3, label=impl)
        for b, r in zip(bars, rs, strict=True):
            ax.annotate(f"{r['tokens_per_sec']:,.0f}\n{r['vs_textbook']['median']:.2f}x tb",
                        (b.get_x() + b.get_width() / 2, r["tokens_per_sec_spread"]["max"]), ha="center",
                        va="bottom", fontsize=8)
    ax.set_xticks([0, 1], ["1 rank", "2 ranks"])
    ax.set_ylabel(f"tokens/s (all ranks), median of {rounds}, min-max bars")
    ax.set_title(f"CPU DDP over gloo, 1 core per rank, {model['params'] / 1e6:.1f}M params")
    ax.legend()
    ax.margins(y=0.2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
