"""Training device, compute dtype and threads, decided by the device we train on.

The field notes' bug: bf16 was picked because `torch.cuda.is_available()` was true while training on
the CPU. Here the CPU path never touches torch.cuda; bf16 on CPU needs bf16 units (avx512_bf16 or
amx_bf16 in /proc/cpuinfo) *and* the user's consent (--allow-bf16), otherwise fp32.
"""

from __future__ import annotations

import contextlib
import os
from contextlib import nullcontext

import torch

from trainer.config import TrainConfig, UsageError

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(path: str = "/proc/cpuinfo") -> set[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16(flags: set[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return any(f in flags for f in BF16_CPU_FLAGS)


def resolve_dtype(cfg: TrainConfig, flags: set[str] | None = None) -> tuple[str, str]:
    """Return (dtype name, why) for this rank. Raises UsageError for bf16 on a CPU without bf16 units."""
    if cfg.device == "cuda":
        # CUDA only: this is the one place a CUDA query is allowed.
        if cfg.dtype == "auto":
            ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
            return ("bf16", "auto: CUDA device supports bf16") if ok else ("fp32", "auto: CUDA without bf16")
        return cfg.dtype, f"--dtype {cfg.dtype}"
    has = cpu_has_bf16(flags)
    units = "CPU has " + "/".join(f for f in BF16_CPU_FLAGS if f in (flags or cpu_flags())) if has \
        else "CPU has no avx512_bf16/amx_bf16"
    if cfg.dtype == "fp32":
        return "fp32", "--dtype fp32"
    if cfg.dtype == "bf16":
        if not has and not cfg.force_dtype:
            raise UsageError("--dtype bf16 asked for, but this CPU has no bf16 units (avx512_bf16/amx_bf16 "
                             "missing from /proc/cpuinfo), so bf16 would be slower than fp32; use --dtype "
                             "fp32, or add --force-dtype to insist")
        return "bf16", f"--dtype bf16 ({units}{', forced' if not has else ''})"
    if has and cfg.allow_bf16:
        return "bf16", f"auto: {units} and --allow-bf16"
    if has:
        return "fp32", f"auto: {units}, but bf16 not allowed (add --allow-bf16)"
    return "fp32", f"auto: {units}"


def autocast_context(device_type: str, dtype: str):
    """bf16 autocast for the forward pass; fp32 master weights and gradients either way."""
    if dtype == "bf16":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    return nullcontext()


def default_threads(local_world_size: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, local_world_size))


def setup_threads(threads: int, local_world_size: int) -> int:
    n = threads or default_threads(local_world_size)
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # already set (e.g. a second run in the same process)
        torch.set_num_interop_threads(1)
    return n


def banner(cfg: TrainConfig, dtype: str, why: str, threads: int, params: int, world_size: int,
           mem_bytes: int) -> str:
    return (f"ddplab trainer | device {cfg.device} | dtype {dtype} ({why}) | threads {threads} | "
            f"torch {torch.__version__} | params {params:,} | world size {world_size} | "
            f"est. memory/rank {mem_bytes / 2**20:.0f} MiB")
