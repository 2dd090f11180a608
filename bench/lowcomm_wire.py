"""What gloo moves on loopback for one low-communication sync of a model (bench/lowcomm.py's micro-benchmark):
fp32 and bf16 all-reduce, int8/int4 all-gather of codes and scales, and the same with the codec around it.
Two spawned processes, one thread each; medians of `reps` after 3 warm-up repetitions. The run report's
advice (ddplab/lowcomm_advice.py) reads the codec's CPU time from it."""

from __future__ import annotations

import datetime
import socket
import statistics
import time


def _wire_worker(rank: int, port: int, numel: int, reps: int, q) -> None:
    import torch
    import torch.distributed as dist

    from trainer import quant_wire

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    flat = torch.randn(numel)
    ops = {"fp32 all-reduce": (lambda: dist.all_reduce(flat.clone()), numel * 4),
           "bf16 all-reduce": (lambda: dist.all_reduce(flat.to(torch.bfloat16)), numel * 2)}
    for name, bits in quant_wire.BITS.items():
        payload = quant_wire.encode(flat, bits)
        gathered = [torch.empty_like(payload) for _ in range(2)]

        def sync(bits=bits, gathered=gathered):  # what a --comm int8/int4 sync does around the transfer
            dist.all_gather(gathered, quant_wire.encode(flat, bits))
            return sum(quant_wire.decode(g, numel, bits) for g in gathered)

        ops[f"{name} all-gather (codes + scales)"] = (
            lambda payload=payload, gathered=gathered: dist.all_gather(gathered, payload), payload.numel())
        ops[f"{name} encode + all-gather + decode"] = (sync, payload.numel())
    out = {}
    for name, (op, nbytes) in ops.items():
        times = []
        for i in range(reps + 3):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            if i >= 3:
                times.append(time.perf_counter() - t0)
        ms = statistics.median(times) * 1e3
        out[name] = {"bytes": nbytes, "ms_median": round(ms, 3),
                     "gbit_per_s": round(nbytes * 8 / ms / 1e6, 3)}
    if rank == 0:
        q.put(out)
    dist.destroy_process_group()


def wire_bench(numel: int, reps: int) -> dict:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with socket.socket() as sock:  # a free port for the group's rendezvous
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [ctx.Process(target=_wire_worker, args=(r, port, numel, reps, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = q.get(timeout=300)
    for p in procs:
        p.join(timeout=60)
    return {"numel": numel, "reps": reps, "ops": got}
