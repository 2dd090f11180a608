"""DDP's start-up broadcast of the whole model is skipped when the ranks already hold the same parameters
(same seed, same model), and still happens when they do not. Two real ranks over gloo on localhost;
torch's broadcast of module states (`dist._broadcast_coalesced`, what DDP calls at start) is counted."""

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers.trainer_runs import free_port

pytestmark = pytest.mark.slow


def _worker(rank, port, seeds, q):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from trainer import dist as D
    from trainer.agreement import param_sha256, params_already_agree
    from trainer.model import GPT, GPTConfig

    D.init_distributed(timeout_s=60)
    torch.manual_seed(seeds[rank])
    model = GPT(GPTConfig(seq_len=16, n_layer=1, n_embd=32, n_head=1))
    calls = []
    real = dist._broadcast_coalesced

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    dist._broadcast_coalesced = counted
    agree = params_already_agree(model)
    D.wrap_for_ddp(model, init_sync=not agree)
    q.put((rank, {"agree": agree, "broadcasts": len(calls), "sha": param_sha256(model)}))
    D.cleanup()


def _two_ranks(seeds):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, port, seeds, q)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=90) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return got[0], got[1]


def test_ranks_built_from_one_seed_skip_the_broadcast():
    r0, r1 = _two_ranks((7, 7))
    assert r0["agree"] and r1["agree"]
    assert r0["broadcasts"] == r1["broadcasts"] == 0
    assert r0["sha"] == r1["sha"]


def test_ranks_that_differ_get_rank_0s_parameters():
    r0, r1 = _two_ranks((7, 8))
    assert not r0["agree"] and not r1["agree"]
    assert r0["broadcasts"] >= 1 and r1["broadcasts"] >= 1
    assert r0["sha"] == r1["sha"]  # DDP broadcast rank 0's
