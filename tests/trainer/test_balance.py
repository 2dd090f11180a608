"""--balance, pure parts: the share controller and the shared-stream loader (no process group)."""

import numpy as np
import pytest

from trainer.balance import ShareController, micro_sizes, round_shares
from trainer.data.loader import ShardLoader
from trainer.data.shards import open_dataset
from trainer.data.shared_stream import SharedStreamLoader, row_group_tokens
from trainer.data.tokenizer import encode

T = 16


def test_row_group_tokens_count_bos_plus_bytes(small_shards):
    import pyarrow.parquet as pq

    ds = open_dataset(small_shards)
    fname, local = ds.row_groups[5]
    texts = pq.ParquetFile(ds.root / fname).read_row_group(local).column(0).to_pylist()
    assert row_group_tokens(ds)[5] == sum(len(encode(t)) for t in texts)


@pytest.mark.parametrize("world", [2, 3])
def test_shares_cut_one_stream_so_an_epoch_reads_every_token_once(small_shards, world):
    """Changing shares step by step: the ranks' sequences, in rank order, are the union batch that one
    process reads with --batch-size G, every step; over the run no token is skipped or read twice."""
    ds = open_dataset(small_shards)
    G = 6
    loaders = [SharedStreamLoader(ds, r, T) for r in range(world)]
    union = ShardLoader(ds, 0, 1, G, T)
    plans = [[G - world + 1] + [1] * (world - 1), [1] * (world - 1) + [G - world + 1],
             round_shares([2.5] * world, G)]
    total = loaders[0].total
    steps = total // (G * T) + 3  # past the end of the first epoch
    for step in range(steps):
        shares = plans[step % len(plans)]
        parts = [ld.next_batch(shares) for ld in loaders]
        assert [p[0].shape[0] for p in parts] == shares
        ux, uy = union.next_batch()
        assert np.array_equal(np.concatenate([p[0].numpy() for p in parts]), ux.numpy())
        assert np.array_equal(np.concatenate([p[1].numpy() for p in parts]), uy.numpy())
        assert len({(ld.epoch, ld.offset) for ld in loaders}) == 1
    assert loaders[0].epoch == 1
    read = set().union(*(ld.seen for ld in loaders))
    assert read == set(range(len(ds.row_groups)))


def test_a_rank_opens_only_the_row_groups_its_slice_overlaps(small_shards):
    ds = open_dataset(small_shards)
    small, big = SharedStreamLoader(ds, 0, 128), SharedStreamLoader(ds, 1, 128)
    assert max(small.rg_tokens) < 7 * 128  # row groups shorter than the big slice
    for _ in range(small.total // (8 * 128)):
        small.next_batch([1, 7])
        big.next_batch([1, 7])
    assert len(small.seen) < len(big.seen)
    assert len(small.seen | big.seen) >= len(ds.row_groups) - 1


def test_shared_stream_resumes_exactly_from_its_state(shards):
    ds = open_dataset(shards)
    a = SharedStreamLoader(ds, 1, T)
    for _ in range(7):
        a.next_batch([3, 5])
    b = SharedStreamLoader(ds, 1, T, state=a.state_dict())
    for shares in ([3, 5], [2, 6], [4, 4]):
        xa, ya = a.next_batch(shares)
        xb, yb = b.next_batch(shares)
        assert np.array_equal(xa, xb) and np.array_equal(ya, yb)
    with pytest.raises(ValueError, match="--balance"):
        SharedStreamLoader(ds, 0, T, state={"epoch": 0, "k": 0, "row": 0, "tok": 0})


def test_round_shares_keep_the_total_and_one_each():
    assert round_shares([10.0, 6.0], 16) == [10, 6]
    assert sum(round_shares([15.9, 0.01, 0.09], 16)) == 16
    assert min(round_shares([15.9, 0.01, 0.09], 16)) >= 1
    assert micro_sizes(11, 4) == [4, 4, 3] and micro_sizes(3, 8) == [3]
    assert round_shares([10.63, 5.37], 16) == [11, 5]  # no pull toward the uniform split
    assert round_shares([42.7, 21.3], 64) == [43, 21]


def test_controller_converges_to_speed_and_then_holds():
    """Rank 1 takes twice as long per sequence, plus a fixed 20 ms per step: shares settle where the two
    compute times are equal and stay there (no flip-flop from one window to the next)."""
    c = ShareController(24, 2, every=5, damping=0.5)
    history = []
    for i in range(30):
        t = [20 + 10 * c.shares[0], 20 + 20 * c.shares[1]]
        c.update([t[r] / c.shares[r] for r in range(2)], step=5 * (i + 1))
        history.append(list(c.shares))
    final = history[-1]
    t = [20 + 10 * final[0], 20 + 20 * final[1]]
    assert final[0] > final[1] and sum(final) == 24
    assert abs(t[0] - t[1]) <= 20  # within one sequence of the slower rank
    assert all(h == final for h in history[-15:])
    assert len(c.changes) <= 6


def test_controller_state_round_trips():
    c = ShareController(16, 2, every=5, damping=0.5)
    c.update([1.0, 2.0], step=5)
    d = ShareController(16, 2, every=5, damping=0.5, state=c.state_dict())
    assert d.shares == c.shares and d.frac == c.frac and d.changes == c.changes
    with pytest.raises(ValueError):
        ShareController(16, 3, every=5, damping=0.5, state=c.state_dict())


def test_straggler_line_says_what_balancing_did():
    from trainer.resilience import StragglerWatch

    c = ShareController(16, 2, every=5, damping=0.5)
    c.update([10.0, 30.0], step=5)
    with_balance = StragglerWatch(10, 2.0, 2, ["node0", "node1"], shares=c)
    said = with_balance.what_balancing_does(1)
    assert f"--balance gives it {c.shares[1]} of 16 sequences per step (uniform: 8" in said
    assert c.shares[1] < 8
    without = StragglerWatch(10, 2.0, 2, ["node0", "node1"]).what_balancing_does(1)
    assert "every rank waits for it" in without and "ddplab_balance: true" in without


def test_first_estimate_is_taken_whole_later_ones_damped():
    c = ShareController(64, 2, every=3, damping=0.5)
    assert c.update([6.0, 12.0], step=3) and c.shares == [43, 21]
    c.update([6.0, 6.0], step=6)  # both now equally fast per sequence: halfway back
    assert c.frac == pytest.approx([42.667 - (42.667 - 32) / 2, 21.333 + (32 - 21.333) / 2], abs=1e-3)
