"""The training run: setup that all ranks agree on, the DDP loop, checks, checkpoints, summary.

    python -m trainer --data DIR --out DIR --steps N --depth D            # one rank
    torchrun --standalone --nproc_per_node=2 -m trainer --data ... --out ...   # two ranks

Exit codes: 0 done, 2 bad input (one `ddplab: error:` line), 3 ranks disagree (data or parameters).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

import torch

from trainer import checkpoint, elastic
from trainer import dist as D
from trainer.agreement import agree, check_params_agree, params_already_agree, setup_checks
from trainer.balance import ShareController, micro_sizes
from trainer.comm import GradComm
from trainer.config import TrainConfig, UsageError, parse_config
from trainer.data.loader import ShardLoader
from trainer.data.shared_stream import SharedStreamLoader
from trainer.data.tokenizer import VOCAB_SIZE
from trainer.device import autocast_context, banner, setup_threads
from trainer.evaluate import Evaluator
from trainer.local_sgd import LocalSGD, crossed, gather_to_main
from trainer.metrics import CommTimer, JsonlWriter, progress_line
from trainer.model import GPT, GPTConfig, estimate_train_memory, flops_per_token, param_count
from trainer.optim import make_adamw
from trainer.peak import measure_peak_flops, mfu
from trainer.resilience import StragglerWatch, is_comm_failure, lost_peer_line
from trainer.summary import rank_summary, run_summary

# every rank's host and address, gathered at start: a rank that loses a peer names it
_PEERS: list[dict] = []


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to lr*min_lr_frac at the last step (step is 0-based)."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    span = max(1, cfg.steps - cfg.lr_warmup_steps)
    progress = min(1.0, (step - cfg.lr_warmup_steps) / span)
    return cfg.lr * (cfg.min_lr_frac + (1 - cfg.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))


def micro_batches(cfg: TrainConfig, loader, shares: ShareController, rank: int, world: int) -> list:
    """This rank's micro-batches of one step as (x, y, scale, part): backward() runs on scale(mean loss),
    part(scaled loss) is its contribution to this rank's mean loss.

    Uniform: grad_accum micro-batches of --batch-size, loss / grad_accum (as always). --balance: the
    rank's share in micro-batches of at most --batch-size; the mean loss of n sequences is scaled by
    n * world / G, so after DDP divides by the world size the gradient is the mean over every token of
    the global batch: the update one process makes on the union batch.
    """
    if not cfg.balance:
        k = cfg.grad_accum
        return [(*loader.next_batch(), lambda loss: loss / k, lambda v: v) for _ in range(k)]
    x, y = loader.next_batch(shares.shares)
    mine, out, start = shares.shares[rank], [], 0
    for n in micro_sizes(mine, cfg.batch_size):
        w = n * world / shares.G
        out.append((x[start:start + n], y[start:start + n], lambda loss, w=w: loss * w,
                    lambda v, w=w, n=n: v / w * n / mine))
        start += n
    return out


def rebalance(shares: ShareController, records: list[dict], done: int) -> None:
    """Every rank all-gathers its compute ms per sequence over the last window; all move the shares.
    The first step of a process (allocations, first-touch) is left out; the same on every rank."""
    window = records[max(1, len(records) - shares.every):]
    if not window:
        return
    costs = D.all_gather_object(ShareController.window_cost(window))
    before = list(shares.shares)
    if shares.update(costs, done):
        D.print0(f"ddplab: balance: step {done}: shares {before} -> {shares.shares} sequences of "
                 f"{shares.G} (compute ms per sequence: {', '.join(f'{c:.1f}' for c in costs)})")


def write_json(path: Path, obj) -> None:
    checkpoint.atomic_write(Path(path), (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode())


def run(cfg: TrainConfig) -> int:
    if cfg.device == "cuda" and not torch.cuda.is_available():  # the only CUDA query, and only for cuda
        raise UsageError("--device cuda but torch sees no CUDA device; ddplab trains on --device cpu")
    di = D.init_distributed(cfg.device, cfg.pg_timeout_s)
    device = torch.device("cuda", di.local_rank) if cfg.device == "cuda" else torch.device("cpu")
    threads = setup_threads(cfg.threads, di.local_world_size)
    cfg.resolve(di.world_size)  # --global-batch-tokens -> --grad-accum for this world size

    # 1. every rank checks its own input; all ranks see all results before anything is written
    mine, ds, val = setup_checks(cfg, di)
    mine["peak_flops"] = measure_peak_flops()  # this rank's fp32 GEMM FLOP/s, at its thread count: for MFU
    statuses = D.all_gather_object(mine)
    agree(statuses)  # raises unless every rank opened the same data set
    hosts = [s["host"] for s in statuses]
    peaks = [s["peak_flops"] for s in statuses]
    _PEERS[:] = [{"rank": s["rank"], "host": s["host"], "addr": s["addr"]} for s in statuses]
    dtype, why = statuses[di.rank]["dtype"], statuses[di.rank]["why"]
    if len({s["dtype"] for s in statuses}) > 1:  # auto chose bf16 on some nodes only: all use fp32
        dtype, why = "fp32", "auto: not every node has bf16 units"
    run_id = D.broadcast_object(cfg.run_id or time.strftime("run-%Y%m%d-%H%M%S"))

    # 2. model, optimizer, data, resumed state
    gcfg = GPTConfig(vocab_size=VOCAB_SIZE, seq_len=cfg.seq_len, n_layer=cfg.depth, n_embd=cfg.n_embd,
                     n_head=cfg.n_head)
    torch.manual_seed(cfg.seed)
    raw = GPT(gcfg).to(device)
    n_params = sum(p.numel() for p in raw.parameters())
    assert n_params == param_count(gcfg), "param_count() is out of date with the model"
    decay = [p for p in raw.parameters() if p.dim() >= 2]
    opt = make_adamw(decay, cfg.lr, cfg.weight_decay)
    shares = ShareController(cfg.batch_size * cfg.grad_accum * di.world_size, di.world_size,
                             cfg.balance_every, cfg.balance_damping)
    loader = (SharedStreamLoader(ds, di.rank, cfg.seq_len) if cfg.balance
              else ShardLoader(ds, di.rank, di.world_size, cfg.batch_size, cfg.seq_len))
    if cfg.elastic:  # one global position, valid at any world size
        loader = elastic.UniformStream(ds, di.rank, di.world_size, cfg.batch_size, cfg.seq_len)
    node_writer = D.is_main_process() or (cfg.elastic and di.local_rank == 0)  # writes into its OUT
    local = cfg.sync_every > 1  # low-communication mode: H local steps, then one parameter sync
    lsgd = (LocalSGD(raw.parameters(), cfg.sync_every, cfg.steps, cfg.outer_lr, cfg.outer_momentum,
                     wire=cfg.comm, overlap=cfg.sync_overlap)
            if local else None)
    start_step, loss_first = 0, None
    evaluator = Evaluator(val, cfg.eval_every_tokens, di.rank, di.world_size)
    tokens_per_step = cfg.tokens_per_rank_step * di.world_size
    if cfg.elastic:  # the newest checkpoint any node holds, whatever the world size that wrote it
        resumed, membership = elastic.agree_and_load(cfg, ds.digest, node_writer)
        run_id = resumed.get("run_id", run_id) if resumed is not None else run_id  # one id across groups
    else:
        resumed = checkpoint.load_for_resume(cfg, ds.digest, di.world_size) if cfg.resume else None
    one = 0 if cfg.elastic else di.rank  # elastic checkpoints hold one data position and one RNG state
    if resumed is not None:
        raw.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["optim_ranks"][di.rank] if local else resumed["optim"])
        try:
            if local:
                lsgd.load_state_dict(resumed["local_sgd"])
            loader.load_state_dict(resumed["data"][one])
            if cfg.balance:
                shares.load_state_dict(resumed["balance"])
        except (ValueError, KeyError) as e:
            raise UsageError(f"checkpoint {resumed['path']}: {e}; resume with the settings it was "
                             f"written with") from None
        torch.set_rng_state(resumed["rng"][one])
        start_step, loss_first = resumed["step"], resumed.get("loss_first")
        evaluator.load_state_dict(resumed.get("val"))
    elif cfg.resume:
        D.print0(f"ddplab: no checkpoint in {checkpoint.ckpt_dir(cfg.out)}, starting at step 0")

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    resolved = cfg.to_dict() | {"run_id": run_id, "dtype_resolved": dtype, "dtype_why": why,
                                "threads_resolved": threads, "world_size": di.world_size,
                                "tokens_per_step": tokens_per_step,
                                "val_row_groups_resolved": val.row_groups if val else 0}
    if node_writer:
        write_json(out / "config.json", resolved)
    if cfg.elastic:
        elastic.record_membership(cfg, membership, di.world_size, node_writer)
    mem = estimate_train_memory(gcfg, cfg.batch_size, di.world_size)
    D.print0(banner(cfg, dtype, why, threads, n_params, di.world_size, mem))
    if local:
        D.print0(f"ddplab: low-communication mode: {cfg.sync_every} local steps per sync, then " +
                 ("the parameters are averaged" if lsgd.plain else
                  f"an outer SGD step (lr {cfg.outer_lr}, Nesterov momentum {cfg.outer_momentum}) on the "
                  f"averaged parameter change") +
                 f"; {lsgd.bytes_per_sync / 1e6:.2f} MB per sync in {cfg.comm} (--allow-local-sgd)" +
                 ("; each sync overlaps the next steps and lands one sync late (--sync-overlap)"
                  if cfg.sync_overlap else ""))
    if cfg.global_batch_tokens:
        D.print0(f"ddplab: global batch {cfg.global_batch_tokens} tokens = {cfg.batch_size} x {cfg.seq_len} "
                 f"x {di.world_size} ranks x {cfg.grad_accum} micro-steps (--grad-accum {cfg.grad_accum})")
    if evaluator.enabled:
        when = f"every {cfg.eval_every_tokens} tokens and " if cfg.eval_every_tokens else ""
        D.print0(f"ddplab: validation: {val.row_groups} held-out row groups, {val.sequences} sequences "
                 f"({val.sequences * cfg.seq_len} tokens), evaluated {when}at the end")
    if resumed is not None:
        D.print0(f"ddplab: resumed from {resumed['path']} at step {start_step}")

    model = torch.compile(raw) if cfg.compile else raw
    model = D.wrap_for_ddp(model, cfg.bucket_cap_mb, init_sync=not params_already_agree(raw))
    timer = CommTimer()
    comm = GradComm(cfg, di.world_size, timer)
    comm.install(model)
    if local:
        lsgd.reset_anchor()  # the ranks' parameters are the same now (equal already, or broadcast by DDP)
    if resumed is not None and cfg.comm in ("powersgd", "auto") and di.world_size > 1:
        # PowerSGD's error feedback is per rank and as large as the gradients; it is not checkpointed
        D.print0(f"ddplab: note: --comm {cfg.comm} after a resume starts afresh (" +
                 ("PowerSGD's error feedback and factors" if cfg.comm == "powersgd" else "the trial") +
                 "): training continues, but not bit for bit as an uninterrupted run would")

    # 3. the loop
    metrics = JsonlWriter(out / f"metrics.rank{di.rank}.jsonl",
                          keep_steps_upto=start_step if resumed is not None else None)
    records: list[dict] = []
    stragglers = StragglerWatch(cfg.straggler_every, cfg.straggler_ratio, di.world_size, hosts,
                                shares=shares if cfg.balance else None)
    final_sha = check_params_agree(raw, start_step, hosts)
    last_sync = start_step  # checks and checkpoints happen right after a sync (every step when H = 1)
    # global tokens trained on so far (world sizes may differ across elastic groups: carried in checkpoints)
    tokens_seen = resumed.get("tokens_seen", start_step * tokens_per_step) if resumed is not None else 0
    tokens_at_sync = tokens_seen
    model.train()
    for step in range(start_step, cfg.steps):
        t0 = time.perf_counter()
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        timer.reset()
        option = comm.before_step(step)
        pos = loader.state_dict()
        rg = loader.row_group
        loss_sum = 0.0
        mine = shares.shares[di.rank] if cfg.balance else cfg.batch_size * cfg.grad_accum
        micros = micro_batches(cfg, loader, shares, di.rank, di.world_size)
        for micro, (x, y, scale, part) in enumerate(micros):
            x, y = x.to(device), y.to(device)
            with D.no_sync(model, skip=local or micro < len(micros) - 1):
                with autocast_context(cfg.device, dtype):
                    loss = scale(model(x, y))
                loss.backward()
            loss_sum += part(loss.item())  # this rank's mean loss
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(raw.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        synced = not local or lsgd.due(step + 1)
        exchange = False  # --sync-overlap: a sync point where the ranks need not agree starts a sync only
        if local and synced and lsgd.overlap:
            done = step + 1
            synced = (done == cfg.steps or crossed(cfg.check_every, last_sync, done)
                      or crossed(cfg.ckpt_every, last_sync, done)
                      or evaluator.due(tokens_at_sync, tokens_seen + tokens_per_step, last=False))
            exchange = not synced
        # the loss over all ranks, weighted by each rank's sequences: one 2-number all-reduce on the first
        # step, log steps and the last (not between local-SGD syncs: the ranks would wait for each other)
        want_mean = step == 0 or (synced and ((step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps))
        if want_mean:
            mean_buf = D.all_reduce_sum(torch.tensor([loss_sum * mine, mine], dtype=torch.float64))
        sync = lsgd.sync() if local and synced else lsgd.exchange() if exchange else None
        dt = time.perf_counter() - t0
        c = timer.step_stats()
        if local:  # no gradient all-reduce; a sync blocks: the wait for the slowest rank, then the transfer
            sync = sync or {"sync_ms": 0.0, "wait_ms": 0.0, "sync_bytes": 0}
            c = {"allreduce_ms": sync["sync_ms"], "exposed_ms": sync["wait_ms"] + sync["sync_ms"],
                 "allreduce_bytes": sync["sync_bytes"], "buckets": 1 if sync["sync_bytes"] else 0}
        rec = {"step": step + 1, "loss": loss_sum, "lr": lr, "dt_ms": dt * 1e3,
               "tokens": tokens_per_step, "tokens_per_sec": tokens_per_step / dt,
               "compute_ms": dt * 1e3 - c["exposed_ms"], "allreduce_ms": c["allreduce_ms"],
               "exposed_ms": c["exposed_ms"], "allreduce_bytes": c["allreduce_bytes"],
               "buckets": c["buckets"], "comm": option, "epoch": pos["epoch"], "row_group": rg,
               "share": mine, "wait_ms": c["exposed_ms"], "synced": synced,
               "mfu": mfu(flops_per_token(gcfg), tokens_per_step / dt, peaks)}
        if local:
            rec["sync_ms"], rec["sync_wait_ms"] = c["allreduce_ms"], c["exposed_ms"] - c["allreduce_ms"]
            rec["overlapped"] = exchange  # a sync started here lands at the next sync point
        if want_mean:
            rec["loss_mean"] = float(mean_buf[0] / mean_buf[1])
        if not math.isfinite(loss_sum):
            raise RuntimeError(f"loss is {loss_sum} at step {step + 1}; lower --lr")
        loss_first = rec.get("loss_mean", loss_sum) if loss_first is None else loss_first
        tokens_seen += tokens_per_step
        rec["tokens_seen"] = tokens_seen
        if synced and evaluator.due(tokens_at_sync, tokens_seen, last=step + 1 == cfg.steps):
            rec |= evaluator.evaluate(raw, cfg.device, dtype, tokens_seen)  # after dt: not in tokens/s
        metrics.write(rec)
        records.append(rec)
        comm.after_step(step, rec)
        stragglers.after_step(step + 1, records)
        done = step + 1
        if cfg.balance and shares.due(done):
            rebalance(shares, records, done)
        if D.is_main_process() and (done % cfg.log_every == 0 or done == cfg.steps):
            recent = records[-10:]
            eta = (cfg.steps - done) * sum(r["dt_ms"] for r in recent) / len(recent) / 1e3
            print(progress_line(rec, cfg.steps, eta), flush=True)
        if not synced:  # ranks hold different parameters until the next sync: no check, no checkpoint
            continue
        if done == cfg.steps or crossed(cfg.check_every, last_sync, done):
            final_sha = check_params_agree(raw, done, hosts)
        if done == cfg.steps or crossed(cfg.ckpt_every, last_sync, done):
            positions = D.all_gather_object(loader.state_dict())
            rngs = D.all_gather_object(torch.get_rng_state())
            extra = {}
            if local:  # inner optimizer states differ per rank (DiLoCo keeps them local)
                extra = {"optim_ranks": gather_to_main(opt.state_dict()), "local_sgd": lsgd.state_dict()}
            if cfg.elastic:
                positions, rngs = positions[:1], rngs[:1]
            if node_writer:
                checkpoint.save(out, done, {
                    "step": done, "model": raw.state_dict(), "optim": opt.state_dict(), "data": positions,
                    "rng": rngs, "balance": shares.state_dict(), "config": cfg.to_dict(), "run_id": run_id,
                    "world_size": di.world_size,
                    "data_digest": ds.digest, "loss_first": loss_first, "tokens_seen": tokens_seen,
                    "val": evaluator.state_dict(), **extra}, keep=cfg.ckpt_keep)
        last_sync, tokens_at_sync = done, tokens_seen
    metrics.close()

    # 4. summaries
    mine = rank_summary(rank=di.rank, host=hosts[di.rank], records=records,
                        timing_skip=max(cfg.timing_warmup_steps, comm.timing_skip), loss_first=loss_first,
                        final_param_sha256=final_sha, row_groups_read=loader.seen,
                        data_position=loader.state_dict())
    if local:  # a sync every H steps: the volume per step is the mean, not the last step's
        mine["allreduce_bytes_per_step"] = lsgd.summary(records)["comm_bytes_per_step"]
    write_json(out / f"summary.rank{di.rank}.json", mine)
    per_rank = D.all_gather_object(mine)
    if node_writer:
        facts = {"run_id": run_id, "params": n_params, "world_size": di.world_size, "steps": cfg.steps,
                 "resumed_from_step": start_step if resumed is not None else None,
                 "tokens_per_step": tokens_per_step, "torch_version": torch.__version__, "dtype": dtype,
                 "dtype_why": why, "threads": threads, "hosts": hosts, "data_digest": ds.digest,
                 **comm.summary(), "bucket_cap_mb": cfg.bucket_cap_mb,
                 "flops_per_token": flops_per_token(gcfg), "peak_flops_per_rank": peaks,
                 "mfu": mfu(flops_per_token(gcfg), per_rank[0].get("tokens_per_sec"), peaks),
                 "est_memory_bytes_per_rank": mem,
                 "balance": shares.state_dict() if cfg.balance else None,
                 # the mode: H = 1 all-reduces gradients every step; H > 1 is local SGD / DiLoCo
                 "sync_every": cfg.sync_every, "local_sgd": lsgd.summary(records) if local else None,
                 "grad_accum": cfg.grad_accum, "global_batch_tokens": cfg.global_batch_tokens or None,
                 "tokens_seen": tokens_seen, "val_row_groups": resolved["val_row_groups_resolved"],
                 "val_sequences": val.sequences if val else None, "val_curve": evaluator.curve,
                 "val_loss": evaluator.curve[-1][1] if evaluator.curve else None}
        write_json(out / "summary.json", run_summary(per_rank, facts))
    D.barrier()
    D.print0("ddplab: done")
    return 0


def _error_exit(code: int) -> int:
    """The exit code of a distributed run that stops on an error every rank has reported: leave at once.
    Tearing the group down while the peers leave too aborts now and then inside gloo ("terminate called
    without an active exception", exit -6 instead of the code); nothing is left to write (metrics are
    flushed per line, checkpoints renamed into place)."""
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
        return run(cfg)
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        return _error_exit(2)
    except D.RanksDisagree as e:
        print(f"ddplab: error: {e}", file=sys.stderr, flush=True)
        return _error_exit(3)
    except Exception as e:
        if not is_comm_failure(e) or not D.info().is_distributed:
            raise
        # a peer died, hung or became unreachable: one line naming it, no traceback, no cleanup
        # (destroying a process group whose peer is gone can block)
        master = f"{os.environ.get('MASTER_ADDR', '')}:{os.environ.get('MASTER_PORT', '')}".strip(":")
        line = lost_peer_line(e, D.info().rank, _PEERS, master)
        print(f"ddplab: error: {line}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(1)
    finally:
        D.cleanup()
