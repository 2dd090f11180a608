"""The CPU check (ddplab/code_check.py) on public training repositories, before and after a change (issue 28).

    .venv/bin/python bench/code_check_repos.py [--before 564a633] [--out bench/results/code_check_repos.md]

Each repository is read from its snapshot under /work/.mirror/<owner>+<name>/repo (the search tool's `fetch`
puts it there; a repository not fetched is reported as such) at the commit recorded in ENTRIES: its .py
files are copied to a temporary folder and `python -m ddplab code-check --json` scans the entry point twice,
with ddplab as of git ref --before and as in this checkout. Nothing of the repositories is run here.

The truth of each entry point was established by running it as 2 CPU ranks over gloo on this machine
(`torchrun --standalone --nproc_per_node=2 ENTRY ARGS` under `timeout 120`, OMP_NUM_THREADS=1, loopback
only, torch 2.13.0+cpu), or by reading where a run was infeasible; ENTRIES records the command and outcome.
`true` lists the file:line places that fail (or make the run not a DDP run) on CPU nodes when reached;
`first` the ones a run actually stops at (or would, by reading). An error at a place not in `true` is a
false alarm; a place of `first` with no finding at all is a miss (a warning there counts as caught, and
the table says which severity it got).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror")
TORCHRUN = "torchrun --standalone --nproc_per_node=2"

ENTRIES = [
    dict(repo="karpathy/nanochat", commit="92d63d4e8bb4", entry="-m scripts.base_train",
         run="by reading (its data and tokenizer need downloads); README field notes: "
             "`--device-type=cpu` makes no process group",
         truth="trains alone (no group on CPU); once a group is made, reduce_scatter get_future fails",
         true=["nanochat/common.py:201", "nanochat/optim.py:291", "nanochat/optim.py:316"],
         first=["nanochat/common.py:201"]),
    dict(repo="karpathy/nanoGPT", commit="3adf61e154c3", entry="train.py",
         run=f"{TORCHRUN} train.py config/train_shakespeare_char.py --device=cpu --compile=False "
             "[--backend=gloo] --max_iters=3 ... (random uint16 data)",
         truth="crash: train.py:84 NCCL not built in; with --backend=gloo: train.py:89 set_device",
         true=["train.py:84", "train.py:89", "train.py:162", "train.py:212"],
         first=["train.py:84", "train.py:89"]),
    dict(repo="karpathy/build-nanogpt", commit="6104ab1b5392", entry="train_gpt2.py",
         run=f"{TORCHRUN} train_gpt2.py: stops at hellaswag.py:62 (tiktoken downloads the gpt2 BPE: no "
             "network here); past it, by reading",
         truth="crash: train_gpt2.py:293 assert torch.cuda.is_available()",
         true=["train_gpt2.py:293", "train_gpt2.py:294", "train_gpt2.py:299", "train_gpt2.py:346"],
         first=["train_gpt2.py:293"]),
    dict(repo="KellerJordan/modded-nanogpt", commit="f411b3d346aa", entry="train_gpt.py",
         run=f"{TORCHRUN} train_gpt.py",
         truth="crash: train_gpt.py:27 ModuleNotFoundError triton; CUDA-only throughout (every CUDA "
               "finding is real)",
         true=["*"], first=["train_gpt.py:27"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="distributed/ddp", entry="example.py",
         run=f"{TORCHRUN} example.py",
         truth="exit 0 at example.py:98 'Unable to locate sufficient 2 gpus': nothing trains",
         true=["example.py:98"], first=["example.py:98"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="distributed/ddp-tutorial-series",
         entry="multigpu_torchrun.py", run=f"{TORCHRUN} multigpu_torchrun.py 2 1 --batch_size 8",
         truth="crash: multigpu_torchrun.py:14 set_device",
         true=["multigpu_torchrun.py:14", "multigpu_torchrun.py:15", "multigpu_torchrun.py:27",
               "multigpu_torchrun.py:37", "multigpu_torchrun.py:41", "multigpu_torchrun.py:58",
               "multigpu_torchrun.py:59"],
         first=["multigpu_torchrun.py:14"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="distributed/minGPT-ddp/mingpt", entry="main.py",
         run=f"{TORCHRUN} main.py (hydra, boto3 installed in a side folder)",
         truth="exit 0 at main.py:54 'Unable to locate sufficient 2 gpus': nothing trains",
         true=["main.py:54"], first=["main.py:54"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="imagenet", entry="main.py",
         run="by reading (torchvision for the CPU wheel is not installable here)",
         truth="crash: main.py:157 NCCL (default --dist-backend); with gloo: trains alone (DDP wrap only "
               "on CUDA, main.py:182)",
         true=["main.py:157", "main.py:182", "main.py:223"], first=["main.py:157", "main.py:182"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="distributed/FSDP2", entry="example.py",
         run=f"{TORCHRUN} example.py",
         truth="exit 0 at example.py:38 'Unable to locate sufficient 2 gpus': nothing trains",
         true=["example.py:38"], first=["example.py:38"]),
    dict(repo="pytorch/examples", commit="77f55b912142", sub="distributed/tensor_parallelism",
         entry="fsdp_tp_example.py", run=f"{TORCHRUN} fsdp_tp_example.py",
         truth="exit 0 at fsdp_tp_example.py:44 'Unable to locate sufficient 4 gpus': nothing trains",
         true=["fsdp_tp_example.py:44"], first=["fsdp_tp_example.py:44"]),
]


def checkout(entry: dict, into: Path) -> Path | None:
    """The entry's repository's .py files at its commit, or None when it was not fetched."""
    git = MIRROR / entry["repo"].replace("/", "+") / "repo"
    if not git.is_dir():
        return None
    dest = into / entry["repo"].replace("/", "+")
    if not dest.is_dir():
        names = subprocess.run(["git", "-C", str(git), "ls-tree", "-r", "--name-only", entry["commit"]],
                               capture_output=True, text=True, check=True).stdout.split("\n")
        for name in (n for n in names if n.endswith(".py")):
            blob = subprocess.run(["git", "-C", str(git), "show", f"{entry['commit']}:{name}"],
                                  capture_output=True, check=False)
            if blob.returncode == 0:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                (dest / name).write_bytes(blob.stdout)
    return dest / entry.get("sub", "")


def ddplab_at(ref: str, into: Path) -> Path:
    """A copy of this repository's ddplab/ package as of git ref `ref`."""
    dest = into / f"ddplab-{ref}"
    if not dest.is_dir():
        dest.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "ddplab"], capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def scan(code: Path, entry: str, ddplab_root: Path) -> list[dict]:
    out = subprocess.run([sys.executable, "-m", "ddplab", "code-check", "--code-dir", str(code),
                          f"--entrypoint={entry}", "--json"], capture_output=True, text=True, check=False,
                         cwd=ddplab_root, env={**os.environ, "PYTHONPATH": str(ddplab_root)})
    if out.returncode not in (0, 1):
        raise SystemExit(f"code-check failed on {code} {entry}: {out.stderr[-500:]}")
    return json.loads(out.stdout)["findings"]


def score(findings: list[dict], entry: dict) -> dict:
    places = {f"{f['path']}:{f['line']}": f["severity"] for f in findings if f["severity"] == "error"}
    warned = {f"{f['path']}:{f['line']}" for f in findings if f["severity"] == "warning"}
    true = set(entry["true"])
    false_alarms = sorted(p for p in places if "*" not in true and p not in true)
    misses = [p for p in entry["first"] if p not in places and p not in warned]
    caught_as_warning = [p for p in entry["first"] if p not in places and p in warned]
    return {"errors": sum(f["severity"] == "error" for f in findings),
            "warnings": sum(f["severity"] == "warning" for f in findings),
            "false_alarms": false_alarms, "misses": misses, "as_warning": caught_as_warning}


def cell(s: dict) -> str:
    return f"{s['errors']} / {s['warnings']}"


def listing(items: list[str]) -> str:
    return f"{len(items)}" + (f" ({', '.join(items)})" if items else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--before", default="564a633", help="git ref of ddplab before the change")
    p.add_argument("--out", help="write the markdown table here (default: stdout)")
    args = p.parse_args()
    rows, totals = [], {"fa_before": 0, "fa_after": 0, "miss_before": 0, "miss_after": 0}
    with tempfile.TemporaryDirectory() as tmp:
        before_root = ddplab_at(args.before, Path(tmp))
        for e in ENTRIES:
            code = checkout(e, Path(tmp))
            name = f"{e['repo']}@{e['commit'][:7]}" + (f" {e['sub']}" if e.get("sub") else "")
            if code is None:
                rows.append(f"| {name} | `{e['entry']}` | not fetched | | | | |")
                continue
            b, a = score(scan(code, e["entry"], before_root), e), score(scan(code, e["entry"], REPO), e)
            totals["fa_before"] += len(b["false_alarms"])
            totals["fa_after"] += len(a["false_alarms"])
            totals["miss_before"] += len(b["misses"])
            totals["miss_after"] += len(a["misses"])
            warned = f"; first caught as warning: {', '.join(a['as_warning'])}" if a["as_warning"] else ""
            rows.append(f"| {name} | `{e['entry']}` | {e['truth']} | {cell(b)} | {cell(a)} | "
                        f"{listing(b['false_alarms'])} → {listing(a['false_alarms'])} | "
                        f"{listing(b['misses'])} → {listing(a['misses'])}{warned} |")
    lines = [
        f"# CPU check on public repositories (ddplab {args.before} → this checkout)",
        "",
        "Made by `bench/code_check_repos.py` (scan columns); truth from 2-rank CPU runs over gloo or by",
        "reading, as ENTRIES in that script records (command and outcome per entry point).",
        "Findings are errors / warnings. A false alarm is an error at a place that does not fail on CPU",
        "nodes; a miss is a place the run stops at with no finding at all.",
        "",
        "| repo@commit | entry point | truth on 2 CPU ranks (gloo) | before | after | false alarms "
        "before → after | misses before → after |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"Totals: false alarms {totals['fa_before']} → {totals['fa_after']}, "
        f"misses {totals['miss_before']} → {totals['miss_after']}.",
        "",
        "How each truth was found:",
        "",
        *[f"- {e['repo']}{' ' + e['sub'] if e.get('sub') else ''} `{e['entry']}`: {e['run']}"
          for e in ENTRIES],
        "",
    ]
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
