"""Do two ranks of one host still load each other's half-written compiled libraries? Issue 47's fault: two
smoke ranks compiled nanochat into one inductor cache folder and one loaded the other's `main.so` while it
was being written (`InductorError: ImportError: ... file too short`). ddplab now gives each local rank a
folder of its own (roles/launch's rank_python); this bench repeats a cold compile of nanochat by 2 ranks on
one host, into bench/results/nanochat_compile_race/.

Each attempt renders the launch role's real launch.sh, trainer.env and rank_python for one node of 2 local
ranks (ddplab/launch_render.py, as tests/byo/test_compile_cache.py does) and runs them in a fresh
lab folder: torchrun on 127.0.0.1 starts `-m scripts.base_train` of the docs' gloo-patched nanochat in its
smallest configuration (--depth=1, --max-seq-len=64: the same torch.compile calls as d4, the model and
the optimizer's fused steps, with fewer and smaller kernels), every cache cold. Two arms, interleaved:

    own     ddplab's default: each local rank compiles into compile-cache/local<rank>
    shared  both ranks in one folder (TORCHINDUCTOR_CACHE_DIR and TMPDIR in ddplab_env, which ddplab uses
            as set: the old default, both ranks in /tmp/torchinductor_<user>)

An attempt fails when launch.sh exits non-zero; its first error line is kept. Run as root or not:

    python bench/nanochat_compile_race.py [--attempts 5] [--arms own shared]

Writes report.json (every attempt: arm, exit code, seconds, compiled libraries, the error, the load before
and after) and table.md (failures / attempts per arm).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import nanochat_checkout as nc  # noqa: E402  (the docs' commands and the fixture)
from ddplab.launch_render import render_launch  # noqa: E402

OUT = REPO / "bench" / "results" / "nanochat_compile_race"
ARMS = ("own", "shared")
# nanochat's smallest run that compiles what d4 compiles, 3 steps (the checkpoint under the attempt's tag)
SMALLEST = nc.smallest_args(3)
PLACED = {"launch.sh": "launch.sh", "trainer.env": "trainer.env", "rank_python.sh": "rank_python"}
ERROR = re.compile(r"^.*(Error|error:|Traceback|file too short).*$", re.M)


def prepare(root: Path) -> tuple[Path, Path]:
    """The docs' nanochat checkout (gloo patch, data, tokenizer) and a Python with its requirements."""
    code = nc.user_clone(root)
    requirements = code / nc.REQUIREMENTS[1]
    wheelhouse = root / "wheelhouse"
    nc.fill_wheelhouse(wheelhouse, "--requirements", str(requirements),
                       python=f"{sys.version_info.major}.{sys.version_info.minor}")  # its ranks run here
    bin_dir = nc.control_venv(root / "venv", wheelhouse, requirements)
    nc.shell(nc.TOK_TRAIN, code, path_first=bin_dir)
    nc.shell(nc.ddplab_path(nc.APPLY), code)
    return code, bin_dir / "python"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(lab_root: Path, code: Path, python: Path, arm: str, tag: str) -> Path:
    """The launch role's files for one node of 2 local ranks, placed as start-rank places them: the run
    folder."""
    lab = {"root": str(lab_root), "code": str(code), "pythonpath": str(code), "data": str(lab_root / "data"),
           "runs": str(lab_root / "runs"), "socket": str(lab_root / "tmux.sock"),
           "python_file": str(lab_root / "python"), "compile_cache": str(lab_root / "compile-cache")}
    env = {"NANOCHAT_BASE_DIR": "base_dir"}
    if arm == "shared":
        shared = lab_root / "compile-cache" / "shared"
        env |= {"TORCHINDUCTOR_CACHE_DIR": str(shared), "TMPDIR": str(shared / "tmp")}
        (shared / "tmp").mkdir(parents=True)
    run_dir = lab_root / "runs" / tag
    facts = {"ddplab_lab": lab, "ddplab_run": tag, "ddplab_run_dir": str(run_dir),
             "ddplab_rank_cwd": str(code),
             "ddplab_master_addr": "127.0.0.1", "ddplab_master_port": free_port(), "ddplab_node_rank": 0,
             "ddplab_world_size": 1, "ddplab_run_hosts": ["node0"], "ddplab_node_addr": "127.0.0.1",
             "ddplab_nproc_per_node": 2, "ddplab_byo": True, "ddplab_code_dir": str(code),
             "ddplab_entrypoint": "-m scripts.base_train",
             "ddplab_entrypoint_args": [*SMALLEST, f"--model-tag={tag}"], "ddplab_env": env,
             "launch_rank_python": str(python), "launch_rank_threads": 1, "launch_resume_run": False}
    run_dir.mkdir(parents=True)
    for name, text in render_launch(facts).items():
        (run_dir / PLACED[name]).write_text(text)
    (run_dir / "rank_python").chmod(0o755)
    return run_dir


def attempt(work: Path, code: Path, python: Path, k: int, arm: str) -> dict:
    """One cold compile by 2 local ranks: exit code, seconds, libraries built, the first error line."""
    tag = f"{arm}-a{k}"
    lab_root = work / tag
    run_dir = render(lab_root, code, python, arm, tag)
    unset = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "PYTHONPATH",
             "TORCHINDUCTOR_CACHE_DIR", "TMPDIR")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    before, started = os.getloadavg()[0], time.time()
    proc = subprocess.run(["bash", str(run_dir / "launch.sh")], cwd=work, env=env, capture_output=True,
                          text=True, timeout=1800, check=False)
    seconds = time.time() - started
    log = (run_dir / "launch.log").read_text()
    error = ERROR.search(log)
    row = {"attempt": k, "arm": arm, "rc": proc.returncode, "seconds": round(seconds, 1),
           "libraries": len(list((lab_root / "compile-cache").rglob("*.so"))),
           "error": error.group(0).strip()[:300] if proc.returncode and error else "",
           "load": [round(before, 1), round(os.getloadavg()[0], 1)]}
    print(json.dumps(row), flush=True)
    if proc.returncode == 0:
        shutil.rmtree(lab_root)  # the attempt's own folder (a failed one stays for a look)
    else:
        shutil.copy(run_dir / "launch.log", OUT / f"{tag}.log")
    return row


def table(rows: list[dict]) -> str:
    lines = ["| arm | failures / attempts | seconds, median [min-max] | libraries built | load |",
             "|---|---|---|---|---|"]
    for arm in ARMS:
        got = [r for r in rows if r["arm"] == arm]
        if not got:
            continue
        secs = sorted(r["seconds"] for r in got)
        libs = sorted({r["libraries"] for r in got})
        built = str(libs[0]) if len(libs) == 1 else f"{libs[0]}-{libs[-1]}"
        loads = [x for r in got for x in r["load"]]
        lines.append(f"| {arm} | {sum(r['rc'] != 0 for r in got)} / {len(got)} | {secs[len(secs) // 2]:.0f} "
                     f"[{secs[0]:.0f}-{secs[-1]:.0f}] | {built} "
                     f"| {min(loads):.0f} to {max(loads):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=5, help="cold compiles per arm")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    ap.add_argument("--work-in", default="/var/tmp", help="the bench makes a folder of its own in it")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ddplab-nanochat-race-", dir=args.work_in))  # its own folder
    started = time.time()
    code, python = prepare(work / "src")
    print(f"checkout prepared in {time.time() - started:.0f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    rep = {"what": "nanochat " + " ".join(SMALLEST) + ", 2 local ranks, cold caches", "attempts": []}
    for k in range(1, args.attempts + 1):
        for arm in (args.arms if k % 2 else args.arms[::-1]):  # interleaved, the order swapped each round
            rep["attempts"].append(attempt(work, code, python, k, arm))
            (OUT / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
            (OUT / "table.md").write_text(table(rep["attempts"]))
    print(table(rep["attempts"]))
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
