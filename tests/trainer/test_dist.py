"""dist helpers on a real one-rank gloo process group."""

import datetime

import pytest
import torch
import torch.distributed as dist

from tests.helpers.trainer_runs import free_port
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
