"""A/B of DDP step variants of the ~10.8M model, interleaved step by step in one 2-rank process group.

    .venv/bin/python bench/step_ab.py plain,bv-hook,bv-hook-fused,bv-hook-keep [--steps 12]

Launches itself as two ranks, one per core (taskset, one torchrun per core, loopback, 1 thread each), as
bench/trainer_scaling.py does. Every variant holds its own model; each step all variants run once, the
order rotated, so a busy moment on the machine hits all of them. Variant names join these tags:
plain = DDP as tutorials write it; bv = gradient_as_bucket_view (the trainer's DDP); hook = the trainer's
comm hook (trainer/comm.py, fp32); fused = fused AdamW; keep = zero_grad(set_to_none=False);
clip = clip_grad_norm_(1.0); bN = bucket_cap_mb N (default 25); static = static_graph=True.
Prints each variant's median step ms [min-max] and its speed vs the first variant, step by step.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def launch(argv: list[str]) -> None:
    from bench.trainer_scaling import env, free_port

    port = free_port()
    procs = [subprocess.Popen(["taskset", "-c", str(n), sys.executable, "-m", "torch.distributed.run",
                               "--nnodes=2", f"--node-rank={n}", "--nproc-per-node=1",
                               "--master-addr=127.0.0.1", f"--master-port={port}", __file__, *argv],
                              cwd=REPO, env=env())
             for n in (0, 1)]
    sys.exit(max(p.wait() for p in procs))


def main() -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainer.cli import parse_config
    from trainer.comm import GradComm
    from trainer.metrics import CommTimer
    from trainer.model import GPT, GPTConfig

    variants = sys.argv[1].split(",")
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 12
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    c = GPTConfig(n_layer=6, n_embd=384, n_head=6, seq_len=128)

    def build(v: str):
        torch.manual_seed(0)
        m = GPT(c)
        bv = "bv" in v
        caps = [float(t[1:]) for t in v.split("-") if t[:1] == "b" and t[1:].replace(".", "").isdigit()]
        cap = caps[0] if caps else 25.0
        d = DDP(m, gradient_as_bucket_view=bv, forward_sync_buffers=not bv, bucket_cap_mb=cap,
                static_graph="static" in v)
        if "hook" in v:
            GradComm(parse_config(["--data", "d", "--out", "o"]), 2, CommTimer()).install(d)
        fused = True if "fused" in v else None
        o = torch.optim.AdamW(m.parameters(), lr=1e-4, betas=(0.9, 0.95), fused=fused)
        return d, o, m

    models = {v: build(v) for v in variants}
    x, y = torch.randint(0, 257, (8, 128)), torch.randint(0, 257, (8, 128))
    times: dict[str, list[float]] = {v: [] for v in variants}
    for i in range(steps):
        for v in variants[i % len(variants):] + variants[:i % len(variants)]:
            d, o, m = models[v]
            dist.barrier()
            t0 = time.perf_counter()
            loss = d(x, y)
            loss.backward()
            if "clip" in v:
                torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            o.step()
            o.zero_grad(set_to_none="keep" not in v)
            loss.item()
            times[v].append((time.perf_counter() - t0) * 1e3)
    if dist.get_rank() == 0:
        base = variants[0]
        for v in variants:
            t, b = times[v][2:], times[base][2:]  # the first two steps build DDP's buckets
            r = [tb / tv for tv, tb in zip(t, b, strict=True)]
            print(f"{v:24s} step {statistics.median(t):7.1f} ms [{min(t):.0f}-{max(t):.0f}]  "
                  f"speed vs {base}: {statistics.median(r):.3f} [{min(r):.3f}-{max(r):.3f}]", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    if "RANK" in os.environ:
        main()
    else:
        launch(sys.argv[1:])
