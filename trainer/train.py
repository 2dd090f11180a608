"""The training run: the DDP loop, checks, checkpoints, summary (what the ranks agree on and build first:
trainer/start.py).

    python -m trainer --data DIR --out DIR --steps N --depth D            # one rank
    torchrun --standalone --nproc_per_node=2 -m trainer --data ... --out ...   # two ranks

Exit codes: 0 done, 2 bad input (one `ddplab: error:` line), 3 ranks disagree (data or parameters).

`run()` is the loop; each mode's part lives with its concern: the sync point and the sync of
--sync-every H > 1 in local_sgd.py, the shares and micro-batches of --balance in balance.py, the
re-formation of --elastic in elastic.py, the sharding of --shard in shard.py, when and what to checkpoint
(and restore) in checkpoint.py (checkpoint_dcp.py with --shard), when to compare parameters in agreement.py,
when to evaluate in evaluate.py.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trainer import checkpoint, checkpoint_dcp, elastic, shard
from trainer import dist as D
from trainer.agreement import check_is_due, check_params_agree, params_already_agree
from trainer.balance import micro_batches
from trainer.cli import parse_config
from trainer.comm import GradComm
from trainer.config import TrainConfig, UsageError
from trainer.device import autocast_context, banner
from trainer.local_sgd import LocalSGD
from trainer.metrics import CommTimer, JsonlWriter, eta_s, peak_rss_bytes, progress_line
from trainer.model import estimate_train_memory, flops_per_token, param_count
from trainer.optim import lr_at
from trainer.peak import mfu
from trainer.resilience import StragglerWatch, is_comm_failure, lost_peer_line
from trainer.start import PEERS, Parts, Start, agree_on_start, build
from trainer.summary import rank_summary, run_summary


@dataclass
class Progress:
    """Where the run stands; checks and checkpoints happen right after a sync (every step when H = 1)."""
    step: int  # steps done
    loss_first: float | None
    tokens_seen: int  # global tokens trained on (world sizes may differ across elastic groups)
    last_sync: int = 0  # the step the last sync followed
    tokens_at_sync: int = 0
    final_sha: str = ""  # the parameter checksum all ranks agreed on last
    records: list[dict] = field(default_factory=list)  # this process's step records

    @classmethod
    def at(cls, resumed: dict | None, tokens_per_step: int) -> Progress:
        if resumed is None:
            return cls(0, None, 0)
        step = resumed["step"]
        tokens = resumed.get("tokens_seen", step * tokens_per_step)
        return cls(step, resumed.get("loss_first"), tokens, last_sync=step, tokens_at_sync=tokens)


def run(cfg: TrainConfig) -> int:
    start = agree_on_start(cfg)
    di = start.di
    parts = build(cfg, start)
    node_writer = D.is_main_process() or (cfg.elastic and di.local_rank == 0)  # writes into its OUT
    resumed, membership = resume(cfg, start, parts, node_writer)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = resolved_config(cfg, start, parts)
    if node_writer:
        write_json(out / "config.json", resolved)
    if cfg.elastic:
        elastic.record_membership(cfg, membership, di.world_size, node_writer)
    announce(cfg, start, parts, resumed)
    model, comm, timer = wrap_for_ddp(cfg, start, parts, resumed)
    prog = Progress.at(resumed, parts.tokens_per_step)
    metrics = JsonlWriter(out / f"metrics.rank{di.rank}.jsonl",
                          keep_steps_upto=prog.step if resumed is not None else None)
    stragglers = StragglerWatch(cfg.straggler_every, cfg.straggler_ratio, di.world_size, start.hosts,
                                shares=parts.shares if cfg.balance else None)
    prog.final_sha = check_params_agree(parts.raw, prog.step, start.hosts)
    model.train()
    for step in range(prog.step, cfg.steps):
        rec, synced = train_step(cfg, start, parts, model, comm, timer, prog, step)
        if cfg.compile and not prog.records:  # this process's first step compiled: the long wait ends
            D.set_timeout(cfg.pg_timeout_s)
        done = step + 1
        if synced and parts.evaluator.due(prog.tokens_at_sync, prog.tokens_seen, last=done == cfg.steps):
            rec |= parts.evaluator.evaluate(parts.raw, cfg.device, start.dtype, prog.tokens_seen)  # not in dt
        metrics.write(rec)
        prog.records.append(rec)
        comm.after_step(step, rec)
        stragglers.after_step(done, prog.records)
        if cfg.balance and parts.shares.due(done):
            parts.shares.rebalance(prog.records, done)
        if D.is_main_process() and (done % cfg.log_every == 0 or done == cfg.steps):
            print(progress_line(rec, cfg.steps, eta_s(prog.records, cfg.steps - done)), flush=True)
        if synced:  # between syncs the ranks hold different parameters: no check, no checkpoint
            after_sync(cfg, start, parts, prog, done, node_writer)
    metrics.close()
    write_summaries(cfg, start, parts, comm, prog, resumed, resolved, node_writer)
    D.barrier()
    D.print0("ddplab: done")
    return 0


def resume(cfg: TrainConfig, start: Start, parts: Parts, writer: bool) -> tuple[dict | None, dict | None]:
    """Load the checkpoint this run continues from into `parts`; returns it (None: step 0) and, with
    --elastic, the group's membership."""
    membership = None
    if cfg.elastic:  # the newest checkpoint any node holds, whatever the world size that wrote it
        resumed, membership = elastic.agree_and_load(cfg, start.ds.digest, writer)
    elif cfg.shard:  # rank 0's sharded checkpoint, resharded for this world size
        resumed = checkpoint_dcp.load_for_resume(cfg, start.ds.digest) if cfg.resume else None
    else:
        resumed = (checkpoint.load_for_resume(cfg, start.ds.digest, start.di.world_size) if cfg.resume
                   else None)
    if resumed is not None and cfg.shard:
        checkpoint_dcp.restore(resumed, parts)
    elif resumed is not None:
        checkpoint.restore(resumed, cfg, parts, start.di.rank)
        if cfg.elastic:  # one run id across groups
            start.run_id = resumed.get("run_id", start.run_id)
    elif cfg.resume:
        D.print0(f"ddplab: no checkpoint in {checkpoint.ckpt_dir(cfg.out)}, starting at step 0")
    return resumed, membership


def resolved_config(cfg: TrainConfig, start: Start, parts: Parts) -> dict:
    """config.json: the settings as given plus what this run resolved them to."""
    return cfg.to_dict() | {"run_id": start.run_id, "dtype_resolved": start.dtype, "dtype_why": start.why,
                            "threads_resolved": start.threads, "world_size": start.di.world_size,
                            "tokens_per_step": parts.tokens_per_step,
                            "val_row_groups_resolved": start.val.row_groups if start.val else 0}


def announce(cfg: TrainConfig, start: Start, parts: Parts, resumed: dict | None) -> None:
    """Rank 0's banner: the model, the hardware, the mode, the batch, validation, the resumed step."""
    world, val = start.di.world_size, start.val
    n_params = param_count(parts.gcfg)
    mem = estimate_train_memory(parts.gcfg, cfg.batch_size, world, shard=cfg.shard)
    D.print0(banner(cfg, start.dtype, start.why, start.threads, n_params, world, mem))
    if cfg.shard:
        D.print0(shard.describe(cfg.reshard_after_forward, world, shard.local_numel(parts.raw), n_params))
    if parts.lsgd:
        D.print0(parts.lsgd.describe())
    if cfg.global_batch_tokens:
        D.print0(f"ddplab: global batch {cfg.global_batch_tokens} tokens = {cfg.batch_size} x {cfg.seq_len} "
                 f"x {world} ranks x {cfg.grad_accum} micro-steps (--grad-accum {cfg.grad_accum})")
    if parts.evaluator.enabled:
        when = f"every {cfg.eval_every_tokens} tokens and " if cfg.eval_every_tokens else ""
        D.print0(f"ddplab: validation: {val.row_groups} held-out row groups, {val.sequences} sequences "
                 f"({val.sequences * cfg.seq_len} tokens), evaluated {when}at the end")
    if resumed is not None:
        D.print0(f"ddplab: resumed from {resumed['path']} at step {resumed['step']}")


def wrap_for_ddp(cfg: TrainConfig, start: Start, parts: Parts, resumed: dict | None):
    """The model DDP trains (compiled if asked), its gradient communication and the timer of it. With
    --shard: the sharded model itself, its communication timed by FSDP2's hooks (GradComm stays idle)."""
    if cfg.shard:
        return parts.raw, GradComm(cfg, start.di.world_size, CommTimer()), parts.shard_timer
    model = torch.compile(parts.raw) if cfg.compile else parts.raw
    model = D.wrap_for_ddp(model, cfg.bucket_cap_mb, init_sync=not params_already_agree(parts.raw))
    timer = CommTimer()
    comm = GradComm(cfg, start.di.world_size, timer)
    comm.install(model)
    if parts.lsgd:
        parts.lsgd.reset_anchor()  # the ranks' parameters are the same now (equal already, or broadcast)
    if resumed is not None and cfg.comm in ("powersgd", "auto") and start.di.world_size > 1:
        # PowerSGD's error feedback is per rank and as large as the gradients; it is not checkpointed
        D.print0(f"ddplab: note: --comm {cfg.comm} after a resume starts afresh (" +
                 ("PowerSGD's error feedback and factors" if cfg.comm == "powersgd" else "the trial") +
                 "): training continues, but not bit for bit as an uninterrupted run would")
    return model, comm, timer


def train_step(cfg: TrainConfig, start: Start, parts: Parts, model, comm: GradComm, timer: CommTimer,
               prog: Progress, step: int) -> tuple[dict, bool]:
    """One optimizer step (0-based `step`) on every rank and the sync it ends with: the step's record, and
    whether the ranks hold the same parameters now (every step with DDP; at syncs with local SGD)."""
    t0 = time.perf_counter()
    lr = lr_at(cfg, step)
    for g in parts.opt.param_groups:
        g["lr"] = lr
    timer.reset()
    option = comm.before_step(step)
    pos, rg = parts.loader.state_dict(), parts.loader.row_group
    mine = parts.shares.shares[start.di.rank] if cfg.balance else cfg.batch_size * cfg.grad_accum
    done = step + 1
    local = parts.lsgd is not None and not parts.lsgd.per_step(done)  # no gradient all-reduce this step
    loss_sum = forward_backward(cfg, start, parts, model, local)
    synced, started = sync_point(cfg, parts, prog, done)
    # the loss over all ranks, weighted by each rank's sequences: one 2-number all-reduce on the first
    # step, log steps and the last (not between local-SGD syncs: the ranks would wait for each other)
    want_mean = step == 0 or (synced and (done % cfg.log_every == 0 or done == cfg.steps))
    if want_mean:
        mean_buf = D.all_reduce_sum(torch.tensor([loss_sum * mine, mine], dtype=torch.float64))
    lsgd_comm = parts.lsgd.step_comm(synced, started, done) if local else None
    if parts.lsgd and done == parts.lsgd.per_step_until:  # the warm-up's last step: the ranks agree now
        parts.lsgd.reset_anchor()
    dt = time.perf_counter() - t0
    c = lsgd_comm or timer.step_stats()
    tokens = parts.tokens_per_step
    rec = {"step": done, "loss": loss_sum, "lr": lr, "dt_ms": dt * 1e3,
           "tokens": tokens, "tokens_per_sec": tokens / dt,
           "compute_ms": dt * 1e3 - c["exposed_ms"], "allreduce_ms": c["allreduce_ms"],
           "exposed_ms": c["exposed_ms"], "allreduce_bytes": c["allreduce_bytes"],
           "buckets": c["buckets"], "comm": option, "epoch": pos["epoch"], "row_group": rg,
           "share": mine, "wait_ms": c["exposed_ms"], "synced": synced,
           "mfu": mfu(flops_per_token(parts.gcfg), tokens / dt, start.peaks)}
    if parts.lsgd:
        rec |= LocalSGD.step_fields(c, started)
    if cfg.shard:
        rec |= {k: c[k] for k in shard.STEP_KEYS}
    if want_mean:
        rec["loss_mean"] = float(mean_buf[0] / mean_buf[1])
    if not math.isfinite(loss_sum):
        raise RuntimeError(f"loss is {loss_sum} at step {done}; lower --lr")
    prog.loss_first = rec.get("loss_mean", loss_sum) if prog.loss_first is None else prog.loss_first
    prog.tokens_seen += tokens
    rec["tokens_seen"] = prog.tokens_seen
    return rec, synced


def forward_backward(cfg: TrainConfig, start: Start, parts: Parts, model, local: bool) -> float:
    """This rank's micro-batches: forward, backward (DDP all-reduces the gradients during the last one's,
    unless a local step of local SGD skips it), clip, optimizer step. Returns this rank's mean loss."""
    loss_sum = 0.0
    micros = micro_batches(parts.loader, parts.shares if cfg.balance else None, cfg.batch_size,
                           cfg.grad_accum, start.di.rank, start.di.world_size)
    for micro, (x, y, scale, part) in enumerate(micros):
        x, y = x.to(start.device), y.to(start.device)
        with D.no_sync(model, skip=local or micro < len(micros) - 1):
            with autocast_context(cfg.device, start.dtype):
                loss = scale(model(x, y))
            loss.backward()
        loss_sum += part(loss.item())  # this rank's mean loss
    if cfg.grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(parts.raw.parameters(), cfg.grad_clip)
    parts.opt.step()
    parts.opt.zero_grad(set_to_none=True)
    return loss_sum


def sync_point(cfg: TrainConfig, parts: Parts, prog: Progress, done: int) -> tuple[bool, bool]:
    """(sync, start) after step `done`: DDP synchronizes every step; local SGD decides (local_sgd.py),
    told whether a check, checkpoint or evaluation needs the ranks to agree after this step."""
    if parts.lsgd is None or parts.lsgd.per_step(done):
        return True, False
    must_agree = (check_is_due(cfg, prog.last_sync, done) or checkpoint.is_due(cfg, prog.last_sync, done)
                  or parts.evaluator.due(prog.tokens_at_sync, prog.tokens_seen + parts.tokens_per_step,
                                         last=False))
    return parts.lsgd.sync_point(done, must_agree)


def after_sync(cfg: TrainConfig, start: Start, parts: Parts, prog: Progress, done: int,
               node_writer: bool) -> None:
    """Right after a sync: the parameter check and the checkpoint when due; the sync becomes the last."""
    if check_is_due(cfg, prog.last_sync, done):
        prog.final_sha = check_params_agree(parts.raw, done, start.hosts)
    if checkpoint.is_due(cfg, prog.last_sync, done):
        facts = {"run_id": start.run_id, "world_size": start.di.world_size, "data_digest": start.ds.digest,
                 "loss_first": prog.loss_first, "tokens_seen": prog.tokens_seen}
        if cfg.shard:
            checkpoint_dcp.save_run(cfg, parts, done, facts)
        else:
            checkpoint.save_run(cfg, parts, done, facts, node_writer)
    prog.last_sync, prog.tokens_at_sync = done, prog.tokens_seen


def write_summaries(cfg: TrainConfig, start: Start, parts: Parts, comm: GradComm, prog: Progress,
                    resumed: dict | None, resolved: dict, node_writer: bool) -> None:
    """summary.rank{R}.json on every rank, summary.json on every writer (see trainer/summary.py)."""
    di, records, gcfg, val = start.di, prog.records, parts.gcfg, start.val
    mine = rank_summary(rank=di.rank, host=start.hosts[di.rank], records=records,
                        timing_skip=max(cfg.timing_warmup_steps, comm.timing_skip),
                        loss_first=prog.loss_first,
                        final_param_sha256=prog.final_sha, row_groups_read=parts.loader.seen,
                        data_position=parts.loader.state_dict())
    if parts.lsgd:  # a sync every H steps: the volume per step is the mean, not the last step's
        mine["allreduce_bytes_per_step"] = parts.lsgd.summary(records)["comm_bytes_per_step"]
    mine["peak_rss_bytes"] = peak_rss_bytes()  # against the memory estimate (trainer/sizes.py)
    if cfg.shard:
        mine["shard"] = shard.rank_facts(parts.raw, records, max(cfg.timing_warmup_steps, comm.timing_skip))
    write_json(Path(cfg.out) / f"summary.rank{di.rank}.json", mine)
    per_rank = D.all_gather_object(mine)
    if not node_writer:
        return
    facts = {"run_id": start.run_id, "params": param_count(gcfg), "world_size": di.world_size,
             "steps": cfg.steps, "resumed_from_step": resumed["step"] if resumed is not None else None,
             "tokens_per_step": parts.tokens_per_step, "torch_version": torch.__version__,
             "dtype": start.dtype, "dtype_why": start.why, "threads": start.threads, "hosts": start.hosts,
             "data_digest": start.ds.digest, **comm.summary(), "bucket_cap_mb": cfg.bucket_cap_mb,
             "flops_per_token": flops_per_token(gcfg), "peak_flops_per_rank": start.peaks,
             "mfu": mfu(flops_per_token(gcfg), per_rank[0].get("tokens_per_sec"), start.peaks),
             "est_memory_bytes_per_rank": estimate_train_memory(gcfg, cfg.batch_size, di.world_size,
                                                                shard=cfg.shard),
             "shard": shard.run_facts(cfg, [r["shard"] for r in per_rank]) if cfg.shard else None,
             "balance": parts.shares.state_dict() if cfg.balance else None,
             # the mode: H = 1 all-reduces gradients every step; H > 1 is local SGD / DiLoCo
             "sync_every": cfg.sync_every, "local_sgd": parts.lsgd.summary(records) if parts.lsgd else None,
             "grad_accum": cfg.grad_accum, "global_batch_tokens": cfg.global_batch_tokens or None,
             "tokens_seen": prog.tokens_seen, "val_row_groups": resolved["val_row_groups_resolved"],
             "val_sequences": val.sequences if val else None, "val_curve": parts.evaluator.curve,
             "val_loss": parts.evaluator.curve[-1][1] if parts.evaluator.curve else None}
    write_json(Path(cfg.out) / "summary.json", run_summary(per_rank, facts))


def write_json(path: Path, obj) -> None:
    checkpoint.atomic_write(Path(path), (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def _leave(code: int) -> int:
    """The exit of a distributed run once every rank is done (the final barrier) or has reported the same
    error: leave at once, without tearing the group down. Destroying it while the peers leave too aborts
    now and then inside gloo ("terminate called without an active exception", exit -6 instead of the
    code; seen in CI on finished runs and on errors); exiting closes the sockets all the same, and nothing
    is left to write (metrics are flushed per line and closed, summaries and checkpoints renamed into
    place)."""
    if not D.info().is_distributed:
        return code
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv=None) -> int:
    try:
        cfg = parse_config(argv)
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        return 2
    try:
        return _leave(run(cfg))
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        return _leave(2)
    except D.RanksDisagree as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        return _leave(3)
    except Exception as e:
        if not is_comm_failure(e) or not D.info().is_distributed:
            raise
        # a peer died, hung or became unreachable: one line naming it, no traceback, no cleanup
        # (destroying a process group whose peer is gone can block)
        master = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}".strip(":")
        line = lost_peer_line(e, D.info().rank, PEERS, master)
        print(f"ddplab: error: {line}", file=sys.stderr, flush=True)
        return _leave(1)
    finally:
        D.cleanup()
