"""nanochat d4 (the vendored commit, docs/your-code.md's section) on 2 simulated hosts: `ddplab tune` with
the docs' eager line and without it (torch.compile on), into bench/results/tune_nanochat_simlan/.

The checkout is prepared as tests/byo/test_nanochat_simlan.py prepares it (bench/nanochat_checkout.py: the
wheelhouse, the control venv, the tokenizer, the gloo patch); hosts pinned one core each (--cpus auto). Each
mode's tune runs `all` through launch.yml (the smoke run on the master first: with compilation on it warms the
compile cache that launch ships to node1), then 1x1 and 1x2 on the master (they reuse the smoke run's
caches). Run as root: `python bench/nanochat_compile.py [--seconds 90] [--rounds 1]`. Each mode's tune
(its logs and run folders) stays in the bench's own folder under --work-in; bench/results/ gets
report.json (both modes, each layout's first-step dt, the load average before and after) and tune.png:
docs/your-code.md's table comes from report.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import nanochat_checkout as nc  # noqa: E402
from nodeprobe import log_metrics  # noqa: E402
from simlan import cluster as simlan  # noqa: E402

OUT = REPO / "bench" / "results" / "tune_nanochat_simlan"
EAGER_LINE = re.compile(r"^  TORCH_COMPILE_OVERRIDE_BACKENDS: .*\n", re.M)  # the docs' eager line


def checkout(root: Path, cluster) -> tuple[Path, Path, Path]:
    code = nc.user_clone(root)
    inventory = nc.user_inventory(root, cluster, code)
    wheelhouse = root / "wheelhouse"
    nc.fill_wheelhouse(wheelhouse, "-i", str(inventory))
    bin_dir = nc.control_venv(root / "venv", wheelhouse, code / nc.REQUIREMENTS[1])
    nc.shell(nc.TOK_TRAIN, code, path_first=bin_dir)
    nc.shell(nc.EXCLUDE, code)
    nc.shell(nc.ddplab_path(nc.APPLY), code)
    nc.git(code, "commit", "-qam", "gloo patch (ddplab)")
    return code, inventory, wheelhouse


def code_yml(inventory: Path, code: Path, compiled: bool, wheelhouse: Path) -> None:
    text = nc.docs_code_yml(code)
    if compiled:
        text, found = EAGER_LINE.subn("", text)
        assert found == 1, "the docs' eager line moved: update bench/nanochat_compile.py"
    (inventory / "group_vars" / "all" / "code.yml").write_text(
        text + f"ddplab_wheelhouse_dir: {wheelhouse}\nddplab_threads: 1\nddplab_smoke_seconds: 240\n")


def first_step_ms(out: Path, rid: str, layout: str) -> float | None:
    """nanochat's dt of its first step (step 0) in a layout's log: the compile when it is cold."""
    log = out / "runs" / rid / "node0" / "launch.log" if layout == "all" else out / f"{rid}.log"
    if not log.exists():
        return None
    records = log_metrics.read_log(str(log), "", whole=True)["records"]
    return next((r["dt_ms"] for r in records if r.get("dt_ms")), None)  # step 0 (an evaluation comes first)


def report(tunes: Path, loads: dict, kept: dict) -> dict:
    """Both modes' tune rows, each layout's first-step dt, the load: report.json and tune.png (the modes not
    measured again are `kept` as report.json had them)."""
    modes = dict(kept)
    for mode in loads:
        tune = json.loads((tunes / mode / "tune.json").read_text())
        for row in tune["rows"]:
            rid = f"{mode}-{row['layout']}-r1"
            row["first_step_ms"] = first_step_ms(tunes / mode, rid, row["layout"])
        modes[mode] = {"rows": tune["rows"], "seconds": tune["seconds"], "rounds": tune["rounds"],
                       "what": tune["what"], "load": loads[mode]}
    rep = {"hosts": "2 simlan hosts, --cpus auto (one core each)", "modes": modes}
    (OUT / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    plot(rep, OUT / "tune.png")
    return rep


def plot(rep: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    layouts = [r["layout"] for r in rep["modes"]["eager"]["rows"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.38
    for k, mode in enumerate(("eager", "compiled")):
        rows = {r["layout"]: r for r in rep["modes"][mode]["rows"]}
        xs = [i + (k - 0.5) * width for i in range(len(layouts))]
        med = [rows[name]["tokens_per_sec"] or 0 for name in layouts]
        lo = [m - (rows[name]["tokens_per_sec_min"] or m) for name, m in zip(layouts, med, strict=True)]
        hi = [(rows[name]["tokens_per_sec_max"] or m) - m for name, m in zip(layouts, med, strict=True)]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=mode)
    ax.set_xticks(range(len(layouts)), layouts)
    ax.set_ylabel("tokens/s (median, min-max)")
    ax.set_title("nanochat d4 on 2 simulated hosts: eager vs torch.compile")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work-in", default="/var/tmp", help="the bench makes a folder of its own in it")
    ap.add_argument("--modes", nargs="+", default=["eager", "compiled"], choices=["eager", "compiled"],
                    help="the modes to (re)measure; the other's results are kept")
    ap.add_argument("--plot-only", action="store_true", help="only redraw tune.png from report.json")
    args = ap.parse_args()
    kept = json.loads((OUT / "report.json").read_text())["modes"] if (OUT / "report.json").exists() else {}
    if args.plot_only:
        plot({"modes": kept}, OUT / "tune.png")
        return 0
    work = Path(tempfile.mkdtemp(prefix="ddplab-nanochat-compile-", dir=args.work_in))  # its own folder
    cluster = simlan.up(2, cpus="auto", force=True)
    started = time.time()
    code, inventory, wheelhouse = checkout(work, cluster)
    print(f"checkout prepared in {time.time() - started:.0f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    tunes, loads = work / "tunes", {}
    for mode in args.modes:
        code_yml(inventory, code, mode == "compiled", wheelhouse)
        loads[mode] = [os.getloadavg()[0]]
        subprocess.run([sys.executable, "-m", "ddplab", "tune", "-i", str(inventory), "--seconds",
                        str(args.seconds), "--rounds", str(args.rounds), "--procs", "2", "--id", mode,
                        "--out", str(tunes)], cwd=REPO, check=False)
        loads[mode].append(os.getloadavg()[0])
    simlan.down()
    report(tunes, loads, {m: v for m, v in kept.items() if m not in loads})
    print(f"each mode's tune (logs, run folders): {tunes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
