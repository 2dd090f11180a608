"""``fingerprint``: everything about one node that must match its peers or fit the run.

Facts only; the control host's verdict (``ddplab/preflight``) decides. Sections: python, torch, cpu
(flags, physical cores vs threads), memory (available vs the model's estimated training memory), code
(content hashes), dtype (resolved, and why), data (shard set vs the node's manifest). """

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

from nodeprobe import cpu_power, hashing

BF16_FLAGS = ("avx512_bf16", "amx_bf16")
DTYPE_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "amx_int8", "avx512_vnni")


def python_info() -> dict:
    return {
        "version": platform.python_version(),
        "major_minor": "{}.{}".format(*sys.version_info[:2]),
        "executable": sys.executable,
        "implementation": platform.python_implementation(),
    }


def torch_info() -> dict:
    try:
        import torch
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001 - any import failure is the finding
        return {"importable": False, "error": f"{type(e).__name__}: {e}"}
    config = torch.__config__.show()
    capability = re.search(r"CPU capability usage: (\S+)", config)
    return {
        "importable": True,
        "version": torch.__version__,
        "git_version": getattr(torch.version, "git_version", None),
        "cuda": torch.version.cuda,
        "debug": bool(getattr(torch.version, "debug", False)),
        "cpu_capability": capability.group(1) if capability else None,
        "config_lines": [ln.strip()[:160] for ln in config.splitlines() if ln.strip().startswith("- ")][:12],
        "gloo_available": bool(dist.is_available() and dist.is_gloo_available()),
        "distributed_available": bool(dist.is_available()),
    }


def _cpuinfo() -> list[dict]:
    blocks, cur = [], {}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
            cur = {}
            continue
        key, _, value = line.partition(":")
        cur[key.strip()] = value.strip()
    if cur:
        blocks.append(cur)
    return blocks


def _lscpu_cores(allowed: set[int]) -> int | None:
    try:
        out = subprocess.run(["lscpu", "-p=CPU,CORE,SOCKET"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    pairs = set()
    for line in out.stdout.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        cpu, core, socket_ = (line.split(",") + ["", "", ""])[:3]
        if cpu.isdigit() and int(cpu) in allowed:
            pairs.add((socket_, core))
    return len(pairs) or None


def cpu_info(threads: int | None) -> dict:
    blocks = _cpuinfo()
    flags = set(blocks[0].get("flags", "").split()) if blocks else set()
    logical = os.cpu_count() or 0
    try:
        allowed = set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = set(range(logical))
    pairs = {
        (b.get("physical id"), b.get("core id"))
        for b in blocks
        if b.get("processor", "").isdigit() and int(b["processor"]) in allowed
    }
    if pairs and None not in {p[1] for p in pairs}:
        physical, source = len(pairs), "/proc/cpuinfo (physical id, core id)"
    else:
        physical, source = _lscpu_cores(allowed), "lscpu -p"
    quota = None
    try:  # cgroup v2 CPU limit, e.g. "200000 100000" = 2 CPUs
        q, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if q != "max":
            quota = round(int(q) / int(period), 2)
    except (OSError, ValueError):
        pass
    return {
        "model": blocks[0].get("model name") if blocks else None,
        "flags": {f: f in flags for f in DTYPE_FLAGS},
        "bf16_units": any(f in flags for f in BF16_FLAGS),
        "logical": logical,
        "allowed": len(allowed),
        "physical_cores": physical,
        "physical_source": source,
        "cgroup_cpus": quota,
        "threads": threads,
        "power": cpu_power.probe(),
    }


def cgroup_memory_limit(proc: Path = Path("/proc/self")) -> int | None:
    """The tightest memory limit on this process's cgroup and its parents, in bytes (None: none): cgroup v2
    memory.max, or memory.limit_in_bytes of a v1 memory hierarchy (a hybrid machine). A container, a
    systemd slice or a simulated host's --mem-limit caps what a rank can use below MemAvailable."""
    mounts: dict[str, Path] = {}  # "v2" or "memory" (v1) -> mount point
    try:
        for line in (proc / "mountinfo").read_text().splitlines():
            pre, _, post = line.partition(" - ")
            fields = post.split()
            if fields and fields[0] == "cgroup2":
                mounts.setdefault("v2", Path(pre.split()[4]))
            elif len(fields) > 2 and fields[0] == "cgroup" and "memory" in fields[2].split(","):
                mounts.setdefault("memory", Path(pre.split()[4]))
        groups = [line.split(":", 2) for line in (proc / "cgroup").read_text().splitlines()]
    except OSError:
        return None
    limits = []
    for _, controllers, path in (g for g in groups if len(g) == 3):
        kind = "v2" if controllers == "" else "memory" if "memory" in controllers.split(",") else None
        if kind not in mounts:
            continue
        root, name = mounts[kind], "memory.max" if kind == "v2" else "memory.limit_in_bytes"
        group = root / path.lstrip("/")
        for folder in (group, *group.parents):
            try:
                raw = (folder / name).read_text().strip()
            except OSError:
                raw = "max"
            if raw != "max" and raw.isdigit() and int(raw) < 1 << 62:  # v1 writes "none" as ~2^63
                limits.append(int(raw))
            if folder == root:
                break
    return min(limits, default=None)


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key] = int(parts[0]) * 1024
    except OSError:
        pass
    return out


def model_sizes(args) -> dict:
    """The trainer's sizing rules (trainer/config.py): width 64*depth, heads of 64, byte vocab 257."""
    n_embd = args.n_embd or 64 * args.depth
    return {"depth": args.depth, "n_embd": n_embd, "n_head": args.n_head or max(1, n_embd // 64),
            "seq_len": args.seq_len, "batch_size": args.batch_size, "vocab": args.vocab,
            "world_size": args.world}


def estimate_own(s: dict) -> tuple[int, dict]:
    """A rough training-memory estimate for a nanoGPT-like model in fp32 with AdamW.

    params * 4 bytes * 4 (weights, grads, Adam m and v) + one DDP bucket copy of the grads
    + activations (per block ~16 values per token and width plus the attention rows, logits x3).
    """
    c, layers, t = s["n_embd"], s["depth"], s["seq_len"]
    params = 2 * s["vocab"] * c + layers * 12 * c * c
    state = params * 4 * 4 + (params * 4 if s["world_size"] > 1 else 0)
    tokens = s["batch_size"] * t
    acts = 4 * tokens * (layers * (16 * c + s["n_head"] * t) + 3 * s["vocab"])
    return state + acts, {"params": params, "state_bytes": state, "activation_bytes": acts}


def estimate_trainer(s: dict):
    """The trainer's own estimate when this node's trainer offers one (it is the authority)."""
    try:
        from trainer.model import GPTConfig, estimate_train_memory, param_count
    except Exception:  # noqa: BLE001 - no trainer beside us, or an older one
        return None
    try:
        cfg = GPTConfig(vocab_size=s["vocab"], seq_len=s["seq_len"], n_layer=s["depth"],
                        n_embd=s["n_embd"], n_head=s["n_head"])
        need = int(estimate_train_memory(cfg, batch_size=s["batch_size"], world_size=s["world_size"]))
        return need, {"params": int(param_count(cfg))}
    except Exception:  # noqa: BLE001 - a signature we do not know: fall back to ours
        return None


def memory_info(sizes: dict) -> dict:
    """MemAvailable (capped by a cgroup limit) against the estimated training memory of one rank."""
    mem = _meminfo()
    limit = cgroup_memory_limit()
    est = estimate_trainer(sizes)
    if est is not None:
        (need, breakdown), method = est, "trainer.model.estimate_train_memory"
    else:
        need, breakdown = estimate_own(sizes)
        method = "nodeprobe's own estimate (no trainer.model.estimate_train_memory here): params*4*4 + acts"
    available = mem.get("MemAvailable")
    if limit is not None and available is not None:
        available = min(available, limit)
    return {
        "available_bytes": available,
        "total_bytes": mem.get("MemTotal"),
        "cgroup_limit_bytes": limit,
        "estimate_bytes": need,
        "estimate_method": method,
        "estimate_breakdown": breakdown,
        "sizes": sizes,
    }


# What a run writes into the lab folder besides the shards: the trainer keeps its 3 newest checkpoints
# (trainer/checkpoint.py save(keep=3)) and writes a 4th before it drops the oldest. A checkpoint holds the
# fp32 weights and AdamW's two moments: params * 4 bytes * 3.
CHECKPOINTS_ON_DISK = 4
CHECKPOINT_BYTES_PER_PARAM = 4 * 3


def disk_info(root: str | None, params: int | None) -> dict:
    """Free bytes on the file system of the lab folder (its nearest existing parent) and the bytes the
    run's checkpoints take there."""
    if not root:
        return {"error": "no lab folder given"}
    path = os.path.abspath(os.path.expanduser(root))
    while not os.path.isdir(path) and path != os.path.dirname(path):
        path = os.path.dirname(path)
    usage = shutil.disk_usage(path)
    ckpt = int(params or 0) * CHECKPOINT_BYTES_PER_PARAM
    return {"path": path, "free_bytes": usage.free, "total_bytes": usage.total, "checkpoint_bytes": ckpt,
            "checkpoints": CHECKPOINTS_ON_DISK}


def dtype_info(asked: str, bf16_units: bool, allow_bf16: bool = False) -> dict:
    """The compute dtype the trainer will resolve (mirrors trainer.device.resolve_dtype) and why.

    bf16 on a CPU without bf16 units is a problem even when forced: it is emulated and slow.
    """
    units = "CPU has avx512_bf16/amx_bf16" if bf16_units else "CPU has no avx512_bf16/amx_bf16"
    problem = None
    if asked == "fp32":
        resolved, reason = "fp32", "--dtype fp32"
    elif asked == "bf16":
        resolved, reason = "bf16", f"--dtype bf16 ({units})"
        if not bf16_units:
            problem = "bf16 asked on a CPU without bf16 units: emulated, slower than fp32"
    elif bf16_units and allow_bf16:
        resolved, reason = "bf16", f"auto: {units} and bf16 allowed"
    else:
        resolved, reason = "fp32", f"auto: {units}" + (", bf16 not allowed" if bf16_units else "")
    return {"asked": asked, "resolved": resolved, "reason": reason, "bf16_units": bf16_units,
            "problem": problem}


def run(args) -> dict:
    import socket

    cpu = cpu_info(args.threads)
    sizes = model_sizes(args)
    out = {
        "probe": "fingerprint",
        "host": socket.gethostname(),
        "python": python_info(),
        "torch": torch_info(),
        "cpu": cpu,
        "memory": (memory := memory_info(sizes)),
        "disk": disk_info(getattr(args, "root", None), memory["estimate_breakdown"].get("params")),
        "dtype": dtype_info(args.dtype, cpu["bf16_units"], args.allow_bf16),
        "code": {Path(d).name or str(d): hashing.tree_hash(Path(d)) for d in (args.code or [])},
        "sync_dirs": {name: hashing.tree_hash(Path(path)) for name, _, path
                      in (d.partition("=") for d in (getattr(args, "sync_dir", None) or []))},
    }
    if args.data:
        out["data"] = hashing.shard_set(Path(args.data))
    hashing.flush_cache()  # the warm child ends with os._exit: no atexit
    return out
