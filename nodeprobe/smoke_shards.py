"""The FSDP2 shard check of the smoke run: whether the ranks hold one model after each optimizer step.

Each rank (nodeprobe/smoke_record.py) records ``params_digest`` of the stepped optimizer's parameters; the
judge (nodeprobe/smoke_judge.py) compares the ranks' records with ``disagreement``. Parameters every rank
holds whole must be the same bytes; parameters sharded by FSDP2 (DTensors over a device mesh) must have one
layout on every rank and shards that cover each parameter exactly once over the ranks (each rank holding
all of it trains alone). Standard library only at import: it also runs inside the user's ranks.
"""

from __future__ import annotations

import hashlib


def _update(h, tensor) -> None:
    import torch

    flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
    try:
        h.update(flat.numpy().tobytes())
    except RuntimeError:  # torch without numpy
        h.update(bytes(flat.tolist()))


def params_digest(optimizer) -> tuple[str, dict | None]:
    """What an optimizer's parameters are after its step, in its own order: sha256 of the bytes of every
    parameter this rank holds whole (a plain tensor, a replicated DTensor), which every rank must hold
    alike; and for DTensors sharded over a device mesh (FSDP2's fully_shard), their shards: how many values
    this rank holds of how many, the mesh's size and this rank's place in it, and a sha256 of the layout
    (each one's global shape, placements and the mesh's ranks), which every rank must share. None when no
    parameter is sharded."""
    import torch

    try:
        from torch.distributed.tensor import DTensor, Replicate
    except ImportError:  # a torch without DTensor: nothing is sharded
        DTensor, Replicate = (), None
    whole, layout = hashlib.sha256(), hashlib.sha256()
    shards = {"params": 0, "local_numel": 0, "global_numel": 0, "mesh_size": None, "coordinate": None}
    with torch.no_grad():
        for group in optimizer.param_groups:
            for p in group["params"]:
                if not isinstance(p, DTensor):
                    _update(whole, p)
                elif all(isinstance(pl, Replicate) for pl in p.placements):
                    _update(whole, p.to_local())
                else:
                    mesh = p.device_mesh
                    layout.update(repr((tuple(p.shape), [str(pl) for pl in p.placements],
                                        mesh.mesh.tolist())).encode())
                    shards["params"] += 1
                    shards["local_numel"] += p.to_local().numel()
                    shards["global_numel"] += p.numel()
                    shards["mesh_size"], shards["coordinate"] = mesh.size(), mesh.get_coordinate()
    return whole.hexdigest(), (shards | {"layout": layout.hexdigest()}) if shards["params"] else None


def disagreement(stepped: list[dict]) -> tuple[str, str, str] | None:
    """The first optimizer step after which the ranks (their records, each of which stepped) do not hold one
    model, as (kind, what, fix): parameters every rank holds whole that differ, or parameters sharded by
    FSDP2 whose layouts differ or whose shards do not cover each parameter exactly once over the ranks.
    None when they agree after every step they all made."""
    for k in range(min(len(r["steps"]) for r in stepped)):
        steps = [r["steps"][k] for r in stepped]
        shards = [s.get("shards") for s in steps]
        optimizer = steps[0]["optimizer"]
        if len({s["sha256"] for s in steps}) > 1:
            sharded = any(shards)
            return (
                "disagree", f"the ranks' {'unsharded ' if sharded else ''}parameters differ after optimizer "
                f"step {k + 1} ({optimizer})", "apply fully_shard to the root module too (after its blocks): "
                "a parameter outside every fully_shard unit is neither sharded nor averaged" if sharded else
                "start from the same weights (DDP broadcasts rank 0's) and average the gradients of every "
                "parameter before the step (DDP does; a manual all-reduce must cover all of them)")
        if not any(shards):
            continue
        held = ", ".join(f"rank {r['rank']} {(s or {}).get('local_numel', 0):,}" for r, s in zip(
            stepped, shards, strict=True))
        total = max((s or {}).get("global_numel", 0) for s in shards)
        if not all(shards) or len({s["layout"] for s in shards}) > 1:
            return (
                "shard-layout", f"after optimizer step {k + 1} ({optimizer}) the ranks shard different "
                f"parameters or shapes (values held: {held})", "build the same model on every rank and "
                "apply fully_shard to the same modules, over one device mesh of all the ranks")
        if sum(s["local_numel"] for s in shards) != total:
            return (
                "shard-cover", f"after optimizer step {k + 1} ({optimizer}) the ranks' shards hold "
                f"{sum(s['local_numel'] for s in shards):,} values of a model of {total:,} (values held: "
                f"{held}; device mesh of {shards[0]['mesh_size']}): each rank trains alone",
                "shard over a device mesh of all the ranks (fully_shard's default mesh, or "
                'init_device_mesh("cpu", (world_size,)))')
    return None
