"""Does the docs' nanochat recipe keep torch.compile? Eager (the docs' TORCH_COMPILE_OVERRIDE_BACKENDS line)
and compiled (the line removed) in interleaved rounds on 2 simulated hosts, one rank per node (the field
notes' layout), into bench/results/nanochat_compile_rounds/.

The checkout is bench/nanochat_compile.py's (the docs' section with its gloo patch); hosts pinned one core
each (--cpus auto). A compiled warm-up launch comes first and is not counted: its smoke run compiles cold on
the master and the launch ships that cache to node1, so every counted compiled round starts warm (the cold
compile is paid once, as a lab pays it). Then --rounds rounds, each an eager and a compiled launch through
launch.yml (the order swapped every round: ABBA), each training --iterations steps (the docs' 20 would give
a round 19 steady steps). A round's figure is the median tokens/s over its steps after the first
--skip (the first compiled step loads the cache and compiles what the cache lacks). The load average is
read before and after each launch. With --smoke-rounds N the launches of rounds after N skip the smoke run
(ddplab_smoke_run: false; it judges nothing the rounds measure, and takes minutes on a busy machine); the
first eager launch with it is what the cold warm-up is set against. --resume continues a stopped bench
whose hosts are still up. Run as root:

    python bench/nanochat_rounds.py [--rounds 3] [--iterations 60] [--smoke-rounds 1]

Writes report.json (every round: its tokens/s, first-step dt, loads) and rounds.png; docs/your-code.md's
table `nanochat_rounds` comes from report.json (bench/docs_tables.py).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from nanochat_compile import checkout, code_yml  # noqa: E402  (the docs' checkout and its two code.yml)

from bench import nanochat_checkout as nc  # noqa: E402
from ddplab import tune  # noqa: E402
from nodeprobe import log_metrics  # noqa: E402
from simlan import cluster as simlan  # noqa: E402

OUT = REPO / "bench" / "results" / "nanochat_compile_rounds"
MODES = ("eager", "compiled")
ITERATIONS_ARG = "--num-iterations=20"  # the docs' argument the bench lengthens


def order(k: int) -> tuple[str, ...]:
    """Round k's modes: eager first in odd rounds, compiled first in even ones (ABBA: a drifting load
    weighs on both alike)."""
    return MODES if k % 2 else MODES[::-1]


def lengthen(inventory: Path, iterations: int) -> None:
    path = inventory / "group_vars" / "all" / "code.yml"
    text = path.read_text()
    assert ITERATIONS_ARG in text, "the docs' --num-iterations moved: update bench/nanochat_rounds.py"
    path.write_text(text.replace(ITERATIONS_ARG, f"--num-iterations={iterations}"))


def round_figures(records: list[dict], skip: int, note: str) -> dict:
    """One launch: the median tokens/s of its steps after the first `skip`, its min-max, its first step."""
    steps = [r for r in records if r.get("tokens_per_sec")]
    steady = [r["tokens_per_sec"] for r in steps[skip:]]
    return {"steps": len(steps), "steady_steps": len(steady), "tokens_per_sec": log_metrics.median(steady),
            "tokens_per_sec_min": min(steady, default=None), "tokens_per_sec_max": max(steady, default=None),
            "first_step_ms": steps[0]["dt_ms"] if steps else None, "note": note}


@dataclass
class Lab:
    """The prepared checkout and its inventory, and how each launch runs."""
    work: Path
    code: Path
    inventory: Path
    wheelhouse: Path
    iterations: int
    seconds: int
    skip: int
    smoke: bool = True

    def launch(self, k: int, mode: str) -> dict:
        """One launch of `mode` (round k; 0: the warm-up) through launch.yml: its figures and loads."""
        code_yml(self.inventory, self.code, mode == "compiled", self.wheelhouse)  # the docs' settings
        lengthen(self.inventory, self.iterations)
        if not self.smoke:  # the smoke run judges nothing the rounds measure; it takes minutes at load 15
            with open(self.inventory / "group_vars" / "all" / "code.yml", "a") as f:
                f.write("ddplab_smoke_run: false\n")
        rid = f"{mode}-r{k}"
        before, started = os.getloadavg()[0], time.time()
        records, note = tune.run_all(str(self.inventory), self.work, rid, self.seconds, "node0", "")
        row = {"round": k, "mode": mode, "smoke_run": self.smoke, **round_figures(records, self.skip, note),
               "load": [round(before, 1), round(os.getloadavg()[0], 1)],
               "wall_s": round(time.time() - started)}
        print(f"{rid}: {json.dumps(row)}", flush=True)
        return row


def summary(rounds: list[dict]) -> dict:
    """Per mode: the median of its rounds' figures with their min-max; the compiled/eager ratio per round."""
    out = {}
    for mode in MODES:
        got = [r["tokens_per_sec"] for r in rounds if r["mode"] == mode and r["tokens_per_sec"]]
        loads = [x for r in rounds if r["mode"] == mode for x in r["load"]]
        out[mode] = {"rounds": len(got), "median": log_metrics.median(got), "min": min(got, default=None),
                     "max": max(got, default=None), "load_min": min(loads, default=None),
                     "load_max": max(loads, default=None)}
    pairs = {}
    for r in rounds:
        pairs.setdefault(r["round"], {})[r["mode"]] = r["tokens_per_sec"]
    ratios = [p["compiled"] / p["eager"] for p in pairs.values() if p.get("compiled") and p.get("eager")]
    out["ratio"] = {"median": log_metrics.median(ratios), "min": min(ratios, default=None),
                    "max": max(ratios, default=None), "n": len(ratios)}
    return out


def plot(rep: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for mode, marker in zip(MODES, "os", strict=True):
        got = [(k, r) for k, r in enumerate(rep["rounds"]) if r["mode"] == mode and r["tokens_per_sec"]]
        median = rep["summary"][mode]["median"]
        ax.errorbar([k for k, _r in got], [r["tokens_per_sec"] for _k, r in got],
                    yerr=[[r["tokens_per_sec"] - r["tokens_per_sec_min"] for _k, r in got],
                          [r["tokens_per_sec_max"] - r["tokens_per_sec"] for _k, r in got]],
                    fmt=marker, capsize=3, label=f"{mode} (median {median:,.0f})" if median else mode)
    ax.set_xticks(range(len(rep["rounds"])), [f"r{r['round']}\n{r['load'][0]:.0f}"
                                              for r in rep["rounds"]])
    ax.set_xlabel("round / load at its start")
    ax.set_ylabel("tokens/s (median of steps, min-max)")
    ax.set_title("nanochat d4, 2 simulated hosts x 1 rank: interleaved rounds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def tokens_per_step() -> int:
    """The docs' --total-batch-size: the tokens of one optimizer step over all ranks."""
    return int(re.search(r'"--total-batch-size=(\d+)"', nc.readme_yaml())[1])


def write(rep: dict) -> None:
    rep["summary"] = summary(rep["rounds"])
    rep["tokens_per_step"] = tokens_per_step()
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, OUT / "rounds.png")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=60, help="steps of each launch (the docs say 20)")
    ap.add_argument("--seconds", type=int, default=240, help="longest wait for a launch's training")
    ap.add_argument("--skip", type=int, default=2, help="steps of a launch not counted (warm-up)")
    ap.add_argument("--work-in", default="/var/tmp", help="the bench makes a folder of its own in it")
    ap.add_argument("--resume", metavar="WORK", help="a stopped bench's folder (its hosts still up): the "
                    "launches report.json lacks, without the checkout and the warm-up")
    ap.add_argument("--smoke-rounds", type=int, default=None, help="rounds whose launches run the smoke run "
                    "(default all; after them it is off: it judges nothing the rounds measure)")
    ap.add_argument("--report-only", action="store_true", help="only remake the summary and the plot")
    args = ap.parse_args()
    if args.report_only:
        write(json.loads((OUT / "report.json").read_text()))
        return 0
    if args.resume:
        work, rep = Path(args.resume), json.loads((OUT / "report.json").read_text())
        lab = Lab(work, work / "nanochat", work / "mylab", work / "wheelhouse", rep["iterations"],
                  args.seconds, rep["skip"])
    else:
        work = Path(tempfile.mkdtemp(prefix="ddplab-nanochat-rounds-", dir=args.work_in))  # its own folder
        cluster = simlan.up(2, cpus="auto", force=True)
        started = time.time()
        lab = Lab(work, *checkout(work, cluster), args.iterations, args.seconds, args.skip)
        print(f"checkout prepared in {time.time() - started:.0f} s", flush=True)
        rep = {"hosts": "2 simlan hosts x 1 rank, --cpus auto (one core each)", "iterations": args.iterations,
               "skip": args.skip, "seconds": args.seconds, "warmup": lab.launch(0, "compiled"), "rounds": []}
    done = {(r["round"], r["mode"]) for r in rep["rounds"]}
    for k in range(1, args.rounds + 1):
        lab.smoke = args.smoke_rounds is None or k <= args.smoke_rounds
        for mode in order(k):
            if (k, mode) not in done:
                rep["rounds"].append(lab.launch(k, mode))
                write(rep)  # a launch at a time: a stopped bench keeps what it measured
    simlan.down()
    if not args.resume:
        shutil.rmtree(work)  # the folder this run made (mkdtemp, ~440 MB); a resumed one is the caller's
    print(json.dumps(rep["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
