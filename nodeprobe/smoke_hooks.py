"""What a smoke rank wraps in torch to see what the user's code does (nodeprobe/smoke_rank.py installs it
before the entry point runs; each wrapper tells the rank's Recorder, nodeprobe/smoke_record.py).

init_process_group (refused when its rank or world size is not torchrun's: the group would hang or split),
destroy_process_group, the collectives, DDP's constructor, every optimizer step (torch's global step
post-hook, which every ``torch.optim.Optimizer`` subclass runs), torch.compile's compiles, torch.save and
``socket.getaddrinfo``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smoke_record import Recorder

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single", "all_gather_object",
               "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
               "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "reduce_scatter_single", "scatter_object_list", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")


class RankLayoutError(RuntimeError):
    """The code gave init_process_group a rank or world size other than torchrun's (RANK, WORLD_SIZE)."""


# what taking a node's variable for the run's does on several nodes
ALIAS_HARM = {"LOCAL_RANK": "the rank within a node, repeated on every node (two ranks claim one rank: "
                            "the group never forms)",
              "LOCAL_WORLD_SIZE": "the ranks of one node (each node waits for a group of its own size)",
              "GROUP_RANK": "the node's number, not the process's", "GROUP_WORLD_SIZE": "the number of nodes"}


def layout_mismatch(args: tuple, kwargs: dict) -> str | None:
    """What is wrong with the rank or world size passed to init_process_group(backend, init_method, timeout,
    world_size, rank, ...), measured against the environment torchrun set; None when they agree or are
    left to the environment."""
    env = os.environ
    for name, position, var in (("rank", 4, "RANK"), ("world_size", 3, "WORLD_SIZE")):
        given = kwargs.get(name, args[position] if len(args) > position else -1)
        try:
            given, want = int(given), int(env[var])
        except (TypeError, ValueError, KeyError):
            continue
        if given in (-1, want):
            continue
        alias = next((v for v in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")
                      if env.get(v) == str(given)), "")
        return (f"init_process_group({name}={given}), but torchrun made this process rank {env.get('RANK')} "
                f"of {env.get('WORLD_SIZE')} ({var}={want}), local rank {env.get('LOCAL_RANK')} on node "
                f"{env.get('GROUP_RANK')} of {env.get('GROUP_WORLD_SIZE')}"
                + (f"; {given} is its {alias}: {ALIAS_HARM[alias]}" if alias else ""))
    return None


def install(rec: Recorder) -> None:
    """Wrap init_process_group, the collectives and DDP's constructor; hook every optimizer step."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    def counting(kind, fn):
        def wrapper(*args, **kwargs):
            outer = not getattr(rec.local, "inside", False)  # all_gather_object calls all_gather: count once
            if outer:
                rec.on_call(kind)
            rec.local.inside = True
            try:
                return fn(*args, **kwargs)
            finally:
                if outer:
                    rec.local.inside = False
        wrapper.__wrapped__ = fn
        return wrapper

    original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args, **kwargs):
        wrong = layout_mismatch(args, kwargs)
        if wrong:  # raised here, the place is the user's call; let through, the group would hang or split
            raise RankLayoutError(wrong)
        out = original_init(*args, **kwargs)
        rec.on_init()
        return out

    def destroy_process_group(*args, **kwargs):
        rec.on_ops()
        return original_destroy(*args, **kwargs)

    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.destroy_process_group = destroy_process_group
        for kind in COLLECTIVES:
            fn = getattr(c10d, kind, None)
            if fn is not None:
                setattr(module, kind, counting(kind, fn))
    original_ddp_init = DistributedDataParallel.__init__

    def ddp_init(self, *args, **kwargs):
        original_ddp_init(self, *args, **kwargs)
        rec.on_ddp()

    DistributedDataParallel.__init__ = ddp_init
    watch_compiles(rec)
    register_optimizer_step_post_hook(lambda optimizer, _args, _kwargs: rec.on_step(optimizer))
    install_io(rec)


def install_io(rec: Recorder) -> None:
    """Record what torch.save writes and which hosts the code looks up."""
    import socket

    import torch

    original_save, original_lookup = torch.save, socket.getaddrinfo

    def save(obj, f, *args, **kwargs):
        out = original_save(obj, f, *args, **kwargs)
        rec.on_save(f)
        return out

    def getaddrinfo(host, *args, **kwargs):
        rec.on_lookup(host)
        return original_lookup(host, *args, **kwargs)

    save.__wrapped__, getaddrinfo.__wrapped__ = original_save, original_lookup
    torch.save = save
    socket.getaddrinfo = getaddrinfo


def watch_compiles(rec: Recorder) -> None:
    """Time torch.compile's compiles: each torch.compile call (the first imports dynamo and inductor, seconds
    of a cold start), then dynamo's start and end callbacks around each compile (importing dynamo here
    would cost code that never compiles)."""
    import torch

    original = torch.compile
    installed = []

    def compile_(*args, **kwargs):
        rec.on_compile(True)
        if not installed:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(lambda _args: rec.on_compile(True))
            callback_handler.register_end_callback(lambda _args: rec.on_compile(False))
            installed.append(True)
        try:
            return original(*args, **kwargs)
        finally:
            rec.on_compile(False)

    compile_.__wrapped__ = original
    torch.compile = compile_
