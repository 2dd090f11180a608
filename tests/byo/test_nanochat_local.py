"""karpathy/nanochat's own `-m scripts.base_train` on 2 local CPU ranks, before and after the gloo patch.

The README's "nanochat from its checkout" recipe, on the real repository (tests/byo/fixtures/nanochat:
nanochat vendored unmodified at a pinned commit, with its own tokenizer trainer and a tiny offline data
set in its parquet layout). Unmodified, `compute_init()` makes a process group on CUDA only: on CPU every
rank exits 0 having trained alone. With only that half of gloo.patch, the first optimizer step fails on
gloo's reduce-scatter future. With all of it, the ranks train as one group: nanochat's optimizer
all-reduces the small parameters' gradients (both ranks hold the same AdamW moments) and reduce-scatters
the large ones (each rank holds its half of the state, ZeRO-2 style).

torch.compile's inductor takes minutes on 2 shared CPUs before the first step (nanochat compiles the
model and its fused optimizer steps with fullgraph=True, so TORCH_COMPILE_DISABLE=1 breaks it); the runs
here keep dynamo and run its graphs eagerly (TORCH_COMPILE_OVERRIDE_BACKENDS), which changes no
collective. nanochat's dependencies (its requirements.txt: wandb, rustbpe, tiktoken, ...) are not
ddplab's (`make test` installs them, the Makefile's NANOCHAT_REQUIREMENTS): without them the runs are
skipped, naming what is missing; the CPU check of the same code needs none of them.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddplab.code_check import check
from tests.byo.fixtures.nanochat.make_data import write_base_data

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "nanochat"
PATCH = FIXTURE / "gloo.patch"
# what -m scripts.base_train and -m scripts.tok_train import besides torch (import name: pip name)
DEPS = {"wandb": "wandb", "rustbpe": "rustbpe", "tiktoken": "tiktoken", "requests": "requests",
        "yaml": "pyyaml", "jinja2": "jinja2", "pyarrow": "pyarrow", "filelock": "filelock"}
MISSING = sorted(pip for mod, pip in DEPS.items() if importlib.util.find_spec(mod) is None)
needs_deps = pytest.mark.skipif(
    bool(MISSING), reason=f"nanochat's own dependencies are not installed ({', '.join(MISSING)}): make test "
    f"installs them, or pip install -r {FIXTURE.relative_to(FIXTURE.parents[3])}/requirements.txt")
STEPS = 2
TRAIN_ARGS = ["--device-type=cpu", "--depth=2", "--max-seq-len=128", "--device-batch-size=1",
              "--total-batch-size=256", "--window-pattern=L", f"--num-iterations={STEPS}",
              "--eval-every=-1", "--core-metric-every=-1", "--sample-every=-1"]
RUN_TIMEOUT = 600


def line_of(path: Path, needle: str) -> int:
    hits = [i + 1 for i, ln in enumerate(path.read_text().splitlines()) if needle in ln]
    assert len(hits) == 1, (path, needle, hits)
    return hits[0]


def checkout(dest: Path, patch: bool = False, only: str | None = None) -> Path:
    """A copy of the vendored nanochat; with `patch`, gloo.patch applied (`only` that file's part of it)."""
    shutil.copytree(FIXTURE, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if patch:
        subprocess.run(["git", "apply", *([f"--include={only}"] if only else []), str(PATCH)],
                       cwd=dest, check=True, timeout=60)
    return dest


def torchrun(code: Path, base_dir: Path, tag: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NANOCHAT_BASE_DIR": str(base_dir), "OMP_NUM_THREADS": "1",
           "TORCH_COMPILE_OVERRIDE_BACKENDS": ">=0:eager"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            "-m", "scripts.base_train", *TRAIN_ARGS, f"--model-tag={tag}"]
    return subprocess.run(argv, cwd=code, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)


def optimizer_states(base_dir: Path, tag: str) -> list[dict]:
    """Each rank's optimizer state at the end (nanochat saves one file per rank: its shard)."""
    folder = base_dir / "base_checkpoints" / tag
    return [torch.load(folder / f"optim_{STEPS:06d}_rank{r}.pt", weights_only=True)["state"] for r in (0, 1)]


def state_numel(state: dict) -> int:
    return sum(t.numel() for s in state.values() for t in s.values() if torch.is_tensor(t))


def small_adamw(state: dict) -> dict:
    """The AdamW moments of the parameters nanochat all-reduces whole (fewer than 1024 elements)."""
    return {k: s["exp_avg"] for k, s in state.items() if "exp_avg" in s and s["exp_avg"].numel() < 1024}


def losses(out: str) -> list[float]:
    return [float(m) for m in re.findall(r"^step \d+/\d+ .*?\| loss: ([\d.]+)", out, re.M)]


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """NANOCHAT_BASE_DIR: the data shards, and a tokenizer trained on them by nanochat's scripts.tok_train."""
    base = tmp_path_factory.mktemp("nanochat-base")
    write_base_data(base)
    code = checkout(tmp_path_factory.mktemp("nanochat-tok") / "nanochat")
    r = subprocess.run([sys.executable, "-m", "scripts.tok_train", "--vocab-size=512", "--max-chars=1000000"],
                       cwd=code, env={**os.environ, "NANOCHAT_BASE_DIR": str(base), "OMP_NUM_THREADS": "1"},
                       capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert {p.name for p in (base / "tokenizer").iterdir()} == {"tokenizer.pkl", "token_bytes.pt"}
    return base


def test_the_skipped_runs_name_what_requirements_txt_installs():
    lines = [ln for ln in (FIXTURE / "requirements.txt").read_text().splitlines() if ln[:1].isalnum()]
    names = {re.split(r"[<>=\s#]", ln, maxsplit=1)[0] for ln in lines}
    assert names == set(DEPS.values())


def test_the_cpu_check_names_both_places_and_passes_the_patched_copy(tmp_path):
    code = checkout(tmp_path / "unmodified")
    common, optim = code / "nanochat" / "common.py", code / "nanochat" / "optim.py"
    errors = {(f.path, f.line, f.kind) for f in check(str(code), "-m scripts.base_train")["findings"]
              if f.severity == "error"}
    assert errors == {
        ("nanochat/common.py", line_of(common, 'init_process_group(backend="nccl"'), "pg-only-on-cuda"),
        ("nanochat/optim.py", line_of(optim, "reduce_scatter_tensor(grad_slice"), "get-future"),
        ("nanochat/optim.py", line_of(optim, "reduce_scatter_tensor(grad_chunk"), "get-future")}
    patched = checkout(tmp_path / "patched", patch=True)
    findings = check(str(patched), "-m scripts.base_train")["findings"]
    assert [f for f in findings if f.severity == "error"] == []


def run_two_ranks(tmp_path_factory, base_dir, tag, **patch):
    code = checkout(tmp_path_factory.mktemp(f"nanochat-{tag}") / "nanochat", **patch)
    return torchrun(code, base_dir, tag)


@pytest.fixture(scope="module")
def unmodified(tmp_path_factory, base_dir):
    r = run_two_ranks(tmp_path_factory, base_dir, "unmodified")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r, optimizer_states(base_dir, "unmodified")


@pytest.fixture(scope="module")
def patched(tmp_path_factory, base_dir):
    r = run_two_ranks(tmp_path_factory, base_dir, "patched", patch=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r, optimizer_states(base_dir, "patched")


@pytest.mark.slow
@needs_deps
def test_unmodified_every_rank_trains_alone_and_exits_0(unmodified):
    r, (rank0, rank1) = unmodified
    assert "Distributed world size: 2" in r.stderr  # nanochat's own log line says 2 ...
    assert len(losses(r.stdout)) == STEPS
    # ... but each rank's optimizer saw a world of 1: it holds the whole state and its own moments
    assert state_numel(rank0) == state_numel(rank1)
    small0, small1 = small_adamw(rank0), small_adamw(rank1)
    assert small0.keys() == small1.keys() and small0
    assert not any(torch.equal(small0[k], small1[k]) for k in small0)


@pytest.mark.slow
@needs_deps
def test_compute_init_alone_fails_at_the_reduce_scatter_future(tmp_path_factory, base_dir):
    r = run_two_ranks(tmp_path_factory, base_dir, "half", patch=True, only="nanochat/common.py")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert "RuntimeError: Work::getFuture not implemented" in out
    assert "reduce_scatter_tensor(grad_slice, grad, op=dist.ReduceOp.AVG, async_op=True).get_future()" in out


@pytest.mark.slow
@needs_deps
def test_patched_the_ranks_train_as_one_group(patched, unmodified):
    r, (rank0, rank1) = patched
    assert len(losses(r.stdout)) == STEPS
    # the small parameters' gradients were all-reduced: both ranks took the same AdamW steps
    small0, small1 = small_adamw(rank0), small_adamw(rank1)
    assert small0.keys() == small1.keys() and small0
    assert all(torch.equal(small0[k], small1[k]) for k in small0)
    # the large ones were reduce-scattered: each rank holds half the rows a rank alone holds
    alone = unmodified[1][0]
    for state in (rank0, rank1):
        large = {k: s["exp_avg"] for k, s in state.items() if "exp_avg" in s and k not in small0}
        assert large and all(2 * t.shape[0] == alone[k]["exp_avg"].shape[0] for k, t in large.items())
        assert state_numel(state) < 0.6 * state_numel(alone)
