"""dist helpers on a real one-rank gloo process group."""

import datetime
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from tests.helpers.trainer_runs import free_port
from trainer import dist as D
from trainer.dist import wait_all

reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@pytest.fixture
def gloo_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def test_wait_all_handles_work_with_and_without_futures(gloo_group):
    a, out = torch.ones(4), torch.empty(4)
    rs = reduce_scatter(out, torch.arange(4.0), async_op=True)
    with pytest.raises(RuntimeError, match="getFuture not implemented"):
        rs.get_future()  # the gloo gap from the field notes: wait_all must not rely on futures
    fut = dist.all_reduce(torch.ones(2), async_op=True).get_future()
    works = [dist.all_reduce(a, async_op=True), rs, fut]
    wait_all(works)
    assert torch.equal(a, torch.ones(4)) and torch.equal(out, torch.arange(4.0))


RANK_SCRIPT = """
import os, sys, time, torch
import torch.distributed as dist
from trainer import dist as D
D.init_distributed("cpu", D.first_step_timeout(1.0, compiled=True))
rank = dist.get_rank()
for phase in ("first", "later"):
    if rank == 1:
        time.sleep(4)  # compiling (first), a stall (later)
    try:
        dist.all_reduce(torch.ones(1))
        print(phase, "ok", flush=True)
    except RuntimeError as e:
        print(phase, "timed out", flush=True)
        os._exit(0)
    D.set_timeout(1.0)  # what trainer/train.py does after the first step of a compiled run
"""


def test_a_compiled_runs_first_collective_waits_for_a_cold_compile_then_the_timeout_is_back():
    """Rank 1 compiles 4 s before its first collective, beyond a 1 s ddplab_pg_timeout: rank 0 waits for it
    (the first step's timeout covers a compile); after the first step a 4 s stall times out again."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, text=True) for r in (0, 1)]
    out0 = ranks[0].communicate(timeout=120)[0]
    ranks[1].kill()
    ranks[1].wait()
    assert out0.split("\n")[:2] == ["first ok", "later timed out"], out0
    assert D.first_step_timeout(45.0, compiled=False) == 45.0
