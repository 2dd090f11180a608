"""Process-group plumbing: gloo on CPU, nccl only for CUDA training, bounded timeouts.

Rank gating is explicit: `RANK`/`WORLD_SIZE`/`LOCAL_RANK` from torchrun's environment decide whether
this is a distributed run. Without them (plain `python -m trainer`) the run is world size 1 and no
process group is created; every helper below then works locally. No CUDA call is made unless the
training device is CUDA.
"""

from __future__ import annotations

import builtins
import datetime
import os
import socket
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from trainer.launch_contract import MASTER_PORT


class RanksDisagree(RuntimeError):
    """Ranks hold different data or parameters: exit 3."""


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    backend: str | None = None  # None: no process group (world size 1 without torchrun)

    @property
    def is_distributed(self) -> bool:
        return self.backend is not None


_INFO = DistInfo()
COMPILE_TIMEOUT_S = 1800.0  # torch's own default for a gloo group: covers a cold compile of the first step


def info() -> DistInfo:
    return _INFO


def init_distributed(device_type: str = "cpu", timeout_s: float = 180.0) -> DistInfo:
    """Create the process group from torchrun's env; gloo unless the training device is CUDA."""
    global _INFO
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        _INFO = DistInfo()
        return _INFO
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = "nccl" if device_type == "cuda" else "gloo"
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    _INFO = DistInfo(rank, local_rank, world, local_world, backend)
    return _INFO


def first_step_timeout(timeout_s: float, compiled: bool) -> float:
    """The process group's timeout until the first step ends: a rank that compiles the model cold (--compile:
    minutes on a small CPU, each rank on its own when its cache is cold) keeps the others waiting at the first
    collective, so they wait up to COMPILE_TIMEOUT_S then; ``set_timeout`` brings it back afterwards."""
    return max(timeout_s, COMPILE_TIMEOUT_S) if compiled else timeout_s


def set_timeout(timeout_s: float) -> None:
    if _INFO.is_distributed and dist.is_initialized():
        dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s))


def is_main_process() -> bool:
    return _INFO.rank == 0


def print0(*args, **kwargs):
    if is_main_process():
        kwargs.setdefault("flush", True)
        builtins.print(*args, **kwargs)


def barrier():
    if _INFO.is_distributed:
        dist.barrier()


def cleanup():
    if _INFO.is_distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap_for_ddp(model: torch.nn.Module, bucket_cap_mb: float = 25.0, init_sync: bool = True):
    """DistributedDataParallel on a distributed run, the bare model otherwise. init_sync=False: the ranks
    already hold the same parameters (checked by the caller), so DDP's start-up broadcast is skipped."""
    if not _INFO.is_distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [_INFO.local_rank] if _INFO.backend == "nccl" else None
    # gradient_as_bucket_view: gradients live in the all-reduce buckets, which saves one copy of every
    # gradient each step and the memory of the gradients (measured on simlan, 10.8M params, 2 nodes x 1
    # core: compute 1,217 -> 1,066 ms per step). forward_sync_buffers=False: our only buffers (rotary
    # tables) are constants.
    return DDP(model, device_ids=device_ids, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True,
               forward_sync_buffers=False, init_sync=init_sync)


def no_sync(model, skip: bool):
    """DDP's no_sync() when `skip` (gradient accumulation micro-steps), else a null context."""
    return model.no_sync() if skip and hasattr(model, "no_sync") else nullcontext()


def wait_all(works) -> None:
    """Wait on async collectives whether or not the backend implements futures.

    gloo's Work for some collectives (reduce_scatter, ...) raises `Work::getFuture not implemented`;
    `Work.wait()` exists everywhere, so we use the future when present and fall back to wait().
    """
    for w in works:
        if w is None:
            continue
        if isinstance(w, torch.futures.Future):
            w.wait()
            continue
        try:
            fut = w.get_future()
        except (RuntimeError, AttributeError):
            fut = None
        if fut is not None:
            fut.wait()
        else:
            w.wait()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """`t` summed over the ranks, in place (unchanged on world size 1)."""
    if _INFO.is_distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_gather_object(obj) -> list:
    """Every rank's `obj`, in rank order (a one-element list on world size 1)."""
    if not _INFO.is_distributed:
        return [obj]
    out = [None] * _INFO.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    if not _INFO.is_distributed:
        return obj
    box = [obj if _INFO.rank == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def broadcast_bytes(data: bytes | None, src: int = 0) -> bytes:
    """`data` of rank `src` on every rank (a file's bytes: a checkpoint a node lacks)."""
    if not _INFO.is_distributed:
        return data
    n = torch.tensor([len(data) if _INFO.rank == src else 0], dtype=torch.int64)
    dist.broadcast(n, src=src)
    buf = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if _INFO.rank == src
           else torch.empty(int(n.item()), dtype=torch.uint8))
    dist.broadcast(buf, src=src)
    return data if _INFO.rank == src else buf.numpy().tobytes()


def broadcast_state(state, src: int = 0):
    """Broadcast a nested structure holding tensors: structure as an object, tensors with dist.broadcast.

    Used for resume: only rank 0 has the checkpoint; the others receive it (no shared storage).
    """
    if not _INFO.is_distributed:
        return state
    tensors: list[torch.Tensor] = []

    def strip(x):
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach().contiguous())
            return ("__tensor__", len(tensors) - 1, tuple(x.shape), str(x.dtype).replace("torch.", ""))
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(strip(v) for v in x)
        return x

    skeleton = broadcast_object(strip(state) if _INFO.rank == src else None, src)
    received: list[torch.Tensor] = []

    def fill(x):
        if isinstance(x, tuple) and len(x) == 4 and x[0] == "__tensor__":
            t = tensors[x[1]] if _INFO.rank == src else torch.empty(x[2], dtype=getattr(torch, x[3]))
            received.append(t)
            return t
        if isinstance(x, dict):
            return {k: fill(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(fill(v) for v in x)
        return x

    result = fill(skeleton)
    for t in received:
        if _INFO.backend == "nccl":  # nccl moves CUDA tensors only
            g = t.cuda()
            dist.broadcast(g, src=src)
            t.copy_(g.cpu())
        else:
            dist.broadcast(t, src=src)
    return result


def hostname() -> str:
    return socket.gethostname()


def node_address() -> str:
    """The address peers reach this node at: DDPLAB_ADDR (set by the launch role), else the source
    address of a route toward MASTER_ADDR (a UDP connect sends no packet), else ""."""
    if os.environ.get("DDPLAB_ADDR"):
        return os.environ["DDPLAB_ADDR"]
    master = os.environ.get("MASTER_ADDR", "")
    if not master:
        return ""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((master, int(os.environ.get("MASTER_PORT", MASTER_PORT))))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return ""
