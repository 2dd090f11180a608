"""nanochat d4 (the vendored commit, docs/your-code.md's section) on 2 simulated hosts: `ddplab tune` with
the docs' eager line and without it (torch.compile on), into bench/results/tune_nanochat_simlan/.

The checkout is prepared as tests/byo/test_nanochat_simlan.py prepares it (its helpers: the wheelhouse, the
control venv, the tokenizer, the gloo patch); hosts pinned one core each (--cpus auto). Each mode's
tune runs `all` through launch.yml (the smoke run on the master first: with compilation on it warms the
compile cache that launch ships to node1), then 1x1 and 1x2 on the master (they reuse the smoke run's
caches). Run as root: `python bench/nanochat_compile.py [--seconds 90] [--rounds 1]`. Writes
eager/ and compiled/ (each tune's own files) and tune.md, tune.json, tune.png (both modes in one table).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simlan import cluster as simlan  # noqa: E402
from tests.byo import test_nanochat_simlan as nc  # noqa: E402
from tests.byo.fixtures.nanochat.make_data import write_base_data  # noqa: E402

OUT = REPO / "bench" / "results" / "tune_nanochat_simlan"
EAGER_LINE = '  TORCH_COMPILE_OVERRIDE_BACKENDS: ">=0:eager"'


def checkout(root: Path, cluster) -> tuple[Path, Path, Path]:
    code = root / "nanochat"
    code.mkdir(parents=True)
    shutil.copy2(nc.FIXTURE / "LICENSE", code / "LICENSE")
    for folder in ("nanochat", "scripts"):
        shutil.copytree(nc.FIXTURE / folder, code / folder, ignore=shutil.ignore_patterns("__pycache__"))
    nc.git(code, "init", "-q")
    nc.git(code, "add", ".")
    nc.git(code, "commit", "-qm", "nanochat 92d63d4")
    write_base_data(code / "base_dir")
    shutil.copy(nc.ddplab_path(nc.REQUIREMENTS[0]), code / nc.REQUIREMENTS[1])
    inventory = root / "mylab"
    (inventory / "group_vars" / "all").mkdir(parents=True)
    shutil.copy(cluster.inventory_dir / "hosts.yml", inventory / "hosts.yml")
    shutil.copy(cluster.inventory_dir / "group_vars" / "all" / "simlan.yml", inventory / "group_vars" / "all")
    wheelhouse = root / "wheelhouse"
    (inventory / "group_vars" / "all" / "code.yml").write_text(
        nc.readme_yaml().replace(nc.CODE_DIR_LINE, f"ddplab_code_dir: {code}"))
    nc.fill_wheelhouse(wheelhouse, inventory)
    bin_dir = nc.control_venv(root / "venv", wheelhouse, code / nc.REQUIREMENTS[1])
    nc.shell(nc.TOK_TRAIN, code, path_first=bin_dir)
    nc.shell(nc.EXCLUDE, code)
    nc.shell(nc.ddplab_path(nc.APPLY), code)
    nc.git(code, "commit", "-qam", "gloo patch (ddplab)")
    return code, inventory, wheelhouse


def code_yml(inventory: Path, code: Path, compiled: bool, wheelhouse: Path) -> None:
    text = nc.readme_yaml().replace(nc.CODE_DIR_LINE, f"ddplab_code_dir: {code}")
    if compiled:
        assert EAGER_LINE in text, "the docs' eager line moved: update bench/nanochat_compile.py"
        text = text.replace(EAGER_LINE + "\n", "")
    (inventory / "group_vars" / "all" / "code.yml").write_text(
        text + f"ddplab_wheelhouse_dir: {wheelhouse}\nddplab_threads: 1\nddplab_smoke_seconds: 240\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--work", default="/tmp/nanochat-compile-bench")
    args = ap.parse_args()
    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    cluster = simlan.up(2, cpus="auto", force=True)
    started = time.time()
    code, inventory, wheelhouse = checkout(work, cluster)
    print(f"checkout prepared in {time.time() - started:.0f} s", flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    loads = {}
    for mode in ("eager", "compiled"):
        code_yml(inventory, code, mode == "compiled", wheelhouse)
        shutil.rmtree(OUT / mode, ignore_errors=True)
        loads[mode] = [os.getloadavg()[0]]
        subprocess.run([sys.executable, "-m", "ddplab", "tune", "-i", str(inventory), "--seconds",
                        str(args.seconds), "--rounds", str(args.rounds), "--procs", "2", "--id", mode,
                        "--out", str(OUT)], cwd=REPO, check=False)
        loads[mode].append(os.getloadavg()[0])
    (OUT / "loads.json").write_text(json.dumps(loads) + "\n")
    simlan.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
