"""The validation split and --global-batch-tokens, without a process group: no training loader reads a
held-out row group, the validation batches are fixed, bad settings are one clear error."""

import numpy as np
import pytest

from trainer.config import TrainConfig, UsageError, grad_accum_for
from trainer.data.heldout import ValBatches, held_out_count, split
from trainer.data.loader import ShardLoader
from trainer.data.shards import open_dataset
from trainer.data.shared_stream import SharedStreamLoader
from trainer.data.tokenizer import encode
from trainer.elastic import UniformStream

HELD = 4


@pytest.fixture(scope="module")
def parts(small_shards):
    full = open_dataset(small_shards)
    train, val = split(full, HELD)
    return full, train, val


def test_the_last_row_groups_in_manifest_order_are_held_out(parts):
    full, train, val = parts
    assert len(full.row_groups) == 32
    assert train.row_groups == full.row_groups[:-HELD] and val.row_groups == full.row_groups[-HELD:]
    assert train.digest == full.digest  # the ranks still agree on the whole set


def read_an_epoch(loader, **kw) -> set[int]:
    while loader.state_dict()["epoch"] == 0:
        loader.next_batch(**kw)
    loader.next_batch(**kw)  # into the next epoch: the first row group again
    return loader.seen


def test_no_training_loader_reads_a_held_out_row_group(parts):
    _, train, _ = parts
    n = len(train.row_groups)
    strided = [read_an_epoch(ShardLoader(train, r, 2, 4, 32)) for r in (0, 1)]
    assert strided[0] | strided[1] == set(range(n)) and strided[0].isdisjoint(strided[1])
    for r in (0, 1):  # --balance: the shared stream, cut by shares
        assert read_an_epoch(SharedStreamLoader(train, r, 32), shares=[3, 5]) <= set(range(n))
    for r in (0, 1, 2):  # --elastic
        assert read_an_epoch(UniformStream(train, r, 3, 4, 32)) <= set(range(n))


def test_validation_batches_are_fixed_and_split_over_the_ranks(parts, small_shards):
    import pyarrow.parquet as pq

    _, _, val = parts
    vb = ValBatches(val, batch_size=4, seq_len=32, eval_batches=5)
    assert vb.sequences == 20 and vb.row_groups == HELD and len(vb.batches) == 5
    fname, local = val.row_groups[0]
    first = pq.ParquetFile(small_shards / fname).read_row_group(local).column(0).to_pylist()[0]
    x, y = vb.batch(0)
    assert x.shape == y.shape == (4, 32)
    assert np.array_equal(x[0, :10].numpy(), encode(first)[:10])  # the held-out stream, from its start
    assert np.array_equal(x[0, 1:].numpy(), y[0, :-1].numpy())
    assert [vb.mine(r, 2) for r in (0, 1)] == [[0, 2, 4], [1, 3]]
    assert vb.mine(0, 1) == list(range(5)) and vb.mine(6, 7) == []


def test_a_small_held_out_set_gives_fewer_sequences_never_overlapping_ones(parts):
    _, _, val = parts
    vb = ValBatches(val, batch_size=4, seq_len=32, eval_batches=1000)
    assert vb.sequences == (len(vb.tokens) - 1) // 32 < 4000
    assert vb.batches[-1][1] == vb.sequences


def test_held_out_count():
    assert [held_out_count(-1, n) for n in (1, 15, 16, 32, 100)] == [0, 0, 1, 2, 6]
    assert held_out_count(0, 5) == 0 and held_out_count(4, 5) == 4
    with pytest.raises(UsageError, match="--val-row-groups 5 holds out every row group.*at most 4"):
        held_out_count(5, 5)
    with pytest.raises(UsageError, match="--val-row-groups 9 exceeds the data set's 5 row groups"):
        held_out_count(9, 5)


def cfg(**kw) -> TrainConfig:
    return TrainConfig(data="d", out="o", batch_size=4, seq_len=32, **kw)


def test_global_batch_tokens_sets_grad_accum_from_the_world_size():
    c = cfg(global_batch_tokens=1024)
    assert [grad_accum_for(c, w) for w in (1, 2, 4, 8)] == [8, 4, 2, 1]
    c.resolve(2)
    assert c.grad_accum == 4 and c.tokens_per_rank_step * 2 == 1024
    plain = cfg(grad_accum=3)
    plain.resolve(4)
    assert plain.grad_accum == 3  # without --global-batch-tokens nothing changes


def test_a_global_batch_that_does_not_divide_names_the_nearest_valid_values():
    with pytest.raises(UsageError, match=r"--global-batch-tokens 1000 is not a multiple of --batch-size 4 x "
                       r"--seq-len 32 = 128 tokens; nearest valid: 896 \(--grad-accum 7\) or 1024 "
                       r"\(--grad-accum 8\)"):
        cfg(global_batch_tokens=1000)
    c = cfg(global_batch_tokens=640)
    with pytest.raises(UsageError, match=r"x world size 2 = 256 tokens; nearest valid: 512 "
                       r"\(--grad-accum 2\) or 768 \(--grad-accum 3\)$"):
        c.resolve(2)
    with pytest.raises(UsageError, match=r"nearest valid: 384 \(--grad-accum 1\) \(--elastic: a multiple"):
        cfg(global_batch_tokens=128, elastic=True).resolve(3)
    with pytest.raises(UsageError, match="--grad-accum 2 with --global-batch-tokens 512.*give one of"):
        cfg(global_batch_tokens=512, grad_accum=2)
