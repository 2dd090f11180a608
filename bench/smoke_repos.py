"""The smoke run (nodeprobe/code_smoke.py) on public training entry points, before and after (issue 47).

    .venv/bin/python bench/smoke_repos.py --python PY [--before main] [--out bench/results/smoke_repos.md]

PY: an interpreter with torch 2.13 and the entry points' own packages (requests, tiktoken, sentencepiece,
tqdm, numpy, matplotlib), as a user's ddplab_pip_requirements would give the nodes. Each repository is read
from its snapshot under /work/.mirror/<owner>+<name>/repo (the search tool's `fetch` puts it there; none
of its code is committed here) at the commit in ENTRIES, and each entry point is measured as published and
with the CPU edits a user makes after ddplab named a place (VARIANTS: exact text replacements). For each:

- truth: the run as on 2 nodes of 1 rank each: two torchrun agents (--nnodes=2 --node_rank=0/1,
  --nproc_per_node=1, static rendezvous on 127.0.0.1), each in its own copy of the code as each node has
  one, under a timeout; then, where node 0 saved a checkpoint, the launch again (the resume arguments, or
  the same ones), node 0's new files copied to node 1 first. OMP_NUM_THREADS=1, gloo on lo.
- before: the smoke run of ddplab at git ref --before, with the entry point's arguments;
- after: the smoke run of this checkout with the entry's ddplab_smoke_args (whole run, then the resume).

A miss is a run that fails while the smoke run passes; a false alarm, a refusal of a run that trains. A
refusal is "at the place" when it names the file:line the run fails at.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIRROR = Path("/work/.mirror")
TIMEOUT_S = 150

APPENDIX_A = "appendix-A/01_main-chapter-code/DDP-script-torchrun.py"
SPEED = "ch05/10_llm-training-speed/02_opt_multi_gpu_ddp.py"
LLAMA_ARGS = ["--compile=False", "--device=cpu", "--dtype=float32", "--batch_size=4", "--max_seq_len=32",
              "--dim=32", "--n_layers=2", "--n_heads=2", "--n_kv_heads=2", "--gradient_accumulation_steps=2",
              "--eval_iters=2", "--warmup_iters=2", "--log_interval=1"]
LLAMA_RUN = [*LLAMA_ARGS, "--max_iters=200", "--eval_interval=100"]
LLAMA_GLOO = [("train.py", 'init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
              ("train.py", 'device = f"cuda:{ddp_local_rank}"', 'device = "cpu"'),
              ("train.py", "torch.cuda.set_device(device)", "pass"),
              ("train.py", "DDP(model, device_ids=[ddp_local_rank])", "DDP(model)")]
LLMC_GLOO = [("train_gpt2.py", 'assert torch.cuda.is_available(), "for now i think we need CUDA for DDP"',
              "pass"),
             ("train_gpt2.py", "init_process_group(backend='nccl')", "init_process_group(backend='gloo')"),
             ("train_gpt2.py", "device = f'cuda:{ddp_local_rank}'", "device = 'cpu'"),
             ("train_gpt2.py", "torch.cuda.set_device(device)", "pass")]
TUTORIAL_GLOO = [("multinode.py", 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))\n    '
                  'init_process_group(backend="nccl")', 'init_process_group(backend="gloo")'),
                 ("multinode.py", "self.model = model.to(self.local_rank)", "self.model = model"),
                 ("multinode.py", "DDP(self.model, device_ids=[self.local_rank])", "DDP(self.model)"),
                 ("multinode.py", "source = source.to(self.local_rank)", "pass"),
                 ("multinode.py", "targets = targets.to(self.local_rank)", "pass")]
APPENDIX_GLOO = [(APPENDIX_A, 'init_process_group(backend="nccl", rank=rank, world_size=world_size)',
                  'init_process_group(backend="gloo", rank=rank, world_size=world_size)'),
                 (APPENDIX_A, "torch.cuda.set_device(rank)", "pass"),
                 (APPENDIX_A, "model.to(rank)", 'model.to("cpu")'),
                 (APPENDIX_A, "DDP(model, device_ids=[rank])", "DDP(model)"),
                 (APPENDIX_A, "features, labels = features.to(rank), labels.to(rank)  # New: use rank",
                  "pass")]
SPEED_GLOO = [(SPEED, 'init_process_group(backend="nccl", rank=rank, world_size=world_size)',
               'init_process_group(backend="gloo", rank=rank, world_size=world_size)'),
              (SPEED, "torch.cuda.set_device(rank)", "pass"),
              (SPEED, 'device = torch.device("cuda", rank)', 'device = torch.device("cpu")'),
              (SPEED, "torch.distributed.barrier(device_ids=[device.index])", "torch.distributed.barrier()"),
              (SPEED, 'rank = int(os.environ["LOCAL_RANK"])', 'rank = int(os.environ["RANK"])')]

ENTRIES = [
    dict(name="rasbt/LLMs-from-scratch appendix A", repo="rasbt/LLMs-from-scratch", commit="28c65cdfbc33",
         entry=APPENDIX_A, variants=[
             dict(name="as published", patch=[], args=[]),
             dict(name="gloo, CPU in the training loop", patch=APPENDIX_GLOO, args=[]),
             dict(name="... and RANK for the rank", patch=APPENDIX_GLOO + [
                 (APPENDIX_A, 'rank = int(os.environ["LOCAL_RANK"])', 'rank = int(os.environ["RANK"])')],
                  args=[]),
         ], whole=True),
    dict(name="rasbt/LLMs-from-scratch ch05 DDP speed", repo="rasbt/LLMs-from-scratch",
         commit="28c65cdfbc33", entry=SPEED, variants=[
             dict(name="as published", patch=[], args=[]),
             dict(name="gloo, CPU, RANK", patch=SPEED_GLOO, args=[]),
         ], whole=True),
    dict(name="pytorch/examples ddp-tutorial-series multinode", repo="pytorch/examples",
         commit="77f55b912142", sub="distributed/ddp-tutorial-series", entry="multinode.py", variants=[
             dict(name="as published", patch=[], args=["50", "10", "--batch_size", "32"]),
             dict(name="gloo, CPU", patch=TUTORIAL_GLOO, args=["50", "10", "--batch_size", "32"]),
         ], smoke_args=["2", "1", "--batch_size", "256"]),
    dict(name="karpathy/llm.c train_gpt2.py", repo="karpathy/llm.c", commit="f1e2ace65149",
         entry="train_gpt2.py", variants=[
             dict(name="as published", patch=[], args=["--model=d12", "--num_iterations=100"]),
             dict(name="gloo, CPU", patch=LLMC_GLOO, args=["--model=d12", "--num_iterations=100"]),
         ], smoke_args=["--model=d12", "--num_iterations=2"]),
    dict(name="karpathy/llama2.c train.py", repo="karpathy/llama2.c", commit="350e04fe3543", entry="train.py",
         data="llama2c", variants=[
             dict(name="as published", patch=[], args=LLAMA_RUN),
             dict(name="gloo, CPU", patch=LLAMA_GLOO, args=LLAMA_RUN),
         ], smoke_args=[*LLAMA_ARGS, "--max_iters=4", "--eval_interval=2", "--always_save_checkpoint=True"],
         resume_args=[*LLAMA_ARGS, "--max_iters=6", "--eval_interval=2", "--init_from=resume"]),
]


def checkout(entry: dict, dest: Path) -> Path:
    """The entry's repository's text files at its commit, in dest (its sub folder returned)."""
    git = MIRROR / entry["repo"].replace("/", "+") / "repo"
    if not git.is_dir():
        raise SystemExit(f"{entry['repo']} is not fetched: {git} is missing (the search tool's fetch)")
    names = subprocess.run(["git", "-C", str(git), "ls-tree", "-r", "--name-only", entry["commit"]],
                           capture_output=True, text=True, check=True).stdout.split("\n")
    sub = entry.get("sub", "")
    for name in names:
        if name.startswith(sub) and name.endswith((".py", ".txt", ".json", ".yaml", ".model")):
            blob = subprocess.run(["git", "-C", str(git), "show", f"{entry['commit']}:{name}"],
                                  capture_output=True, check=False)
            if blob.returncode == 0:
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                (dest / name).write_bytes(blob.stdout)
    return dest / sub


def patch(code: Path, edits: list) -> None:
    for rel, old, new in edits:
        path = code / rel
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"{rel}: {old!r} not found: the edit does not fit this commit")
        path.write_text(text.replace(old, new, 1))


def make_data(kind: str, code: Path) -> None:
    """llama2c: two shards of random Llama-2 token ids where train.py's loader looks (pretokenized)."""
    if kind == "llama2c":
        import numpy as np

        folder = code / "data" / "TinyStories_all_data"
        folder.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(0)
        for i in range(2):
            rng.integers(0, 32000, 40_000, dtype=np.uint16).tofile(folder / f"data{i:02d}.bin")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


TRACE = re.compile(r'File "([^"]+)", line (\d+)')


def first_failure(log: str, code: Path) -> dict | None:
    """The first traceback in a node's log that passes through the code folder (a chained exception prints
    its library-only cause first): its last frame there and its exception line."""
    lines = [re.sub(r"^\[rank\d+\]: ?", "", ln) for ln in log.splitlines()]
    root = str(code.resolve()) + os.sep
    first = None
    for i, ln in enumerate(lines):
        if ln.startswith("Traceback (most recent call last)"):
            where, j = None, i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                m = TRACE.search(lines[j])
                if m and os.path.realpath(m.group(1)).startswith(root):
                    where = f"{os.path.relpath(os.path.realpath(m.group(1)), root)}:{m.group(2)}"
                j += 1
            found = {"where": where, "error": lines[j].strip()[:200] if j < len(lines) else ""}
            if where:
                return found
            first = first or found
    return first


def launch(python: str, nodes: list[Path], entry: str, args: list[str], out: Path, tag: str) -> dict:
    """Both nodes' torchrun agents; their exit codes, whether the timeout ended them, the first failure."""
    port, procs = free_port(), []
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONUNBUFFERED": "1"}
    start = time.monotonic()
    for rank, code in enumerate(nodes):
        log = open(out / f"{tag}-node{rank}.log", "wb")  # noqa: SIM115 - closed below
        procs.append((subprocess.Popen(
            [python, "-m", "torch.distributed.run", "--nnodes=2", f"--node_rank={rank}",
             "--nproc_per_node=1", "--master_addr=127.0.0.1", f"--master_port={port}", entry, *args],
            cwd=code, env={**env, "PYTHONPATH": str(code)}, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True), log))
    timed_out = False
    for p, _ in procs:
        try:
            p.wait(timeout=max(1, TIMEOUT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            timed_out = True
    for p, log in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        log.close()
    failures = [first_failure((out / f"{tag}-node{r}.log").read_text(errors="replace"), nodes[r])
                for r in range(2)]
    failure = next((f for f in failures if f and f["where"]), next((f for f in failures if f), None))
    return {"codes": [p.returncode for p, _ in procs], "timed_out": timed_out, "failure": failure,
            "seconds": round(time.monotonic() - start, 1)}


def truth(python: str, src: Path, entry: dict, variant: dict, work: Path) -> dict:
    nodes = [work / f"node{r}" for r in range(2)]
    for node in nodes:
        shutil.copytree(src, node)
    before = {p.relative_to(nodes[0]) for p in nodes[0].rglob("*") if p.is_file()}
    first = launch(python, nodes, entry["entry"], variant["args"], work, "run")
    saved = [p for p in nodes[0].rglob("*") if p.is_file() and p.relative_to(nodes[0]) not in before
             and p.suffix in (".pt", ".pth", ".ckpt", ".bin") and "data" not in p.parts]
    out = {"run": first, "resume": None}
    if first["codes"] == [0, 0] and saved:
        for path in saved:  # node 1 gets the master's checkpoint, as a user who shipped it would
            (nodes[1] / path.relative_to(nodes[0])).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, nodes[1] / path.relative_to(nodes[0]))
        again = entry.get("resume_args") or variant["args"]
        out["resume"] = launch(python, nodes, entry["entry"], again, work, "resume")
    return out


def truth_said(t: dict) -> tuple[bool, str, str | None]:
    """(fails, in words, file:line)."""
    for name in ("run", "resume"):
        r = t[name]
        if r is None:
            continue
        if r["timed_out"]:
            where = (r["failure"] or {}).get("where")
            said = f"{name}: hangs ({TIMEOUT_S} s)" + (f", first error at {where}" if where else "")
            return True, said, where
        if r["codes"] != [0, 0]:
            f = r["failure"] or {}
            return True, f"{name}: fails at {f.get('where')}: {f.get('error', '')[:90]}", f.get("where")
    said = "trains" + (", and resumes from its checkpoint" if t["resume"] else "")
    return False, said, None


def smoke(python: str, nodeprobe_root: Path, src: Path, entry: dict, variant: dict, work: Path,
          whole: bool) -> dict:
    spec = {"python": python, "src": str(src), "scratch": str(work / "smoke"), "entrypoint": entry["entry"],
            "args": variant["args"], "seconds": 240, "steps": 2, "nodes": 2, "threads": 1}
    if whole:
        spec |= {"whole": True, "whole_args": entry.get("smoke_args") or [],
                 "resume_args": entry.get("resume_args") or []}
    proc = subprocess.run([python, "-m", "nodeprobe", "code-smoke"], input=json.dumps(spec),
                          capture_output=True, text=True, cwd=nodeprobe_root, timeout=600, check=False,
                          env={**os.environ, "PYTHONPATH": str(nodeprobe_root)})
    try:
        return json.loads(proc.stdout)
    except ValueError:
        return {"verdict": "error", "problems": [], "error": proc.stderr[-300:]}


def smoke_said(r: dict) -> tuple[str, str | None]:
    if r["verdict"] != "fail":
        return r["verdict"], None
    p = r["problems"][0]
    pass_ = f" ({p['pass']} pass)" if p.get("pass") == "resume" else ""
    return f"refused{pass_}: {p['kind']}" + (f" at {p['where']}" if p.get("where") else ""), p.get("where")


def nodeprobe_at(ref: str, into: Path) -> Path:
    dest = into / f"nodeprobe-{ref}"
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "nodeprobe"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def score(fails: bool, where: str | None, verdict: str, place: str | None) -> str:
    refused = verdict.startswith("refused")
    if fails and not refused:
        return "miss"
    if not fails and refused:
        return "false alarm"
    if fails:
        return "right, at the place" if place and where and place == where else "right"
    return "right"


def arguments_said(e: dict) -> str:
    said = f"{e['name']}: `{' '.join(e['variants'][-1]['args']) or '(none)'}`, smoke "
    said += f"`{' '.join(e.get('smoke_args') or []) or '(the same)'}`"
    return said + (f", resume `{' '.join(e['resume_args'])}`" if e.get("resume_args") else "")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--python", required=True, help="interpreter with torch and the entries' packages")
    p.add_argument("--before", default="main", help="git ref of ddplab before the change")
    p.add_argument("--out", help="write the markdown table here (default: stdout)")
    p.add_argument("--only", default="", help="only entries whose name contains this")
    p.add_argument("--keep", help="keep the work folders (logs) here")
    args = p.parse_args()
    rows, totals = [], {"miss_before": 0, "miss_after": 0, "fa_before": 0, "fa_after": 0, "n": 0}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        before_root = nodeprobe_at(args.before, base)
        for e in (e for e in ENTRIES if args.only in e["name"]):
            for i, v in enumerate(e["variants"]):
                work = base / f"{e['name'].replace('/', '+').replace(' ', '_')}-{i}"
                src = checkout(e, work / "src")
                patch(src, v["patch"])
                make_data(e.get("data", ""), src)
                t = truth(args.python, src, e, v, work)
                fails, said, where = truth_said(t)
                before = smoke(args.python, before_root, src, e, v, work / "before", False)
                b_said, b_place = smoke_said(before)
                after = smoke(args.python, REPO, src, e, v, work / "after", True)
                a_said, a_place = smoke_said(after)
                sb, sa = score(fails, where, b_said, b_place), score(fails, where, a_said, a_place)
                totals["n"] += 1
                totals["miss_before"] += sb == "miss"
                totals["miss_after"] += sa == "miss"
                totals["fa_before"] += sb == "false alarm"
                totals["fa_after"] += sa == "false alarm"
                rows.append(f"| {e['name']}@{e['commit'][:7]} | {v['name']} | {said} | {b_said} ({sb}) | "
                            f"{a_said} ({sa}) |")
                print(rows[-1], flush=True)
    lines = [
        f"# The smoke run on public entry points (ddplab {args.before} → this checkout)",
        "",
        "Made by `bench/smoke_repos.py` (its docstring says how each column is found). Truth: two",
        "torchrun agents of one rank each (2 nodes) on loopback gloo, each in its own copy of the code,",
        "then the launch again where the run saved a checkpoint. Before: the smoke run of ddplab at that",
        "ref with the entry point's arguments (2 optimizer steps). After: with ddplab_smoke_args (the whole",
        "short run) and the pass that resumes from its checkpoint.",
        "",
        "| repo@commit | code | truth on 2 CPU nodes (gloo) | smoke run before | smoke run after |",
        "|---|---|---|---|---|",
        *rows,
        "",
        f"Totals over {totals['n']} runs: misses {totals['miss_before']} → {totals['miss_after']}, "
        f"false alarms {totals['fa_before']} → {totals['fa_after']}.",
        "",
        "Arguments: " + "; ".join(map(arguments_said, ENTRIES)) + ".",
        "",
    ]
    text = "\n".join(lines)
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
