"""--elastic's pure decisions, its flag checks, its checkpoint files and its data position (no process group;
the real elastic runs are in test_elastic_run.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers.trainer_runs import error_lines, trainer
from trainer import checkpoint, elastic
from trainer.cli import check_args
from trainer.config import TrainConfig, UsageError
from trainer.data.shards import open_dataset
from trainer.data.shared_stream import SharedStreamLoader


def test_the_newest_step_wins_and_the_lowest_rank_holding_it_sends():
    assert elastic.choose_source([20, 30, None, 30]) == (30, 1)
    assert elastic.choose_source([None, 10]) == (10, 1)
    assert elastic.choose_source([None, None]) == (None, None)


def test_steps_lost_are_counted_from_the_furthest_node():
    assert elastic.lost_steps([27, 25, 0], 20) == 7
    assert elastic.lost_steps([20, 0], 20) == 0
    assert elastic.lost_steps([], 0) == 0


def test_a_fresh_run_starts_and_anything_else_reforms():
    assert elastic.event_of([0, 0, 0], None) == "start"
    assert elastic.event_of([1, 1], 20) == "reform"
    assert elastic.event_of([0, 0], 20) == "reform"  # a node joined (torchrun restarts, no failure counted)
    assert elastic.event_of([2, 0], None) == "reform"


def test_the_previous_group_is_the_newest_record_any_node_holds():
    old = {"time": 10.0, "nodes": ["a", "b", "c"]}
    new = {"time": 20.0, "nodes": ["a", "c"]}
    assert elastic.previous_nodes([old, new, None]) == ["a", "c"]
    assert elastic.previous_nodes([None, None]) == []


def test_the_reform_line_names_who_left_and_who_joined():
    assert elastic.reform_line(["node1", "node2"], ["node0", "node1", "node2"], 120, 20) == (
        "ddplab: re-formed: 2 nodes (node1, node2), node0 left; resuming at step 120 (20 steps lost)")
    assert elastic.reform_line(["a", "b", "c"], ["a", "b"], 40, 0) == (
        "ddplab: re-formed: 3 nodes (a, b, c), c joined; resuming at step 40 (0 steps lost)")
    assert elastic.reform_line(["a"], [], 6, 0) == (
        "ddplab: re-formed: 1 node (a); resuming at step 6 (0 steps lost)")


@pytest.mark.parametrize("extra, flag", [(["--balance"], "--balance"),
                                         (["--sync-every", "4", "--allow-local-sgd"], "--sync-every 4")])
def test_elastic_refuses_balance_and_local_sgd(extra, flag):
    with pytest.raises(UsageError, match=f"--elastic with {flag}"):
        TrainConfig(data="d", out="o", elastic=True, **{"balance": True} if "--balance" in extra else
                    {"sync_every": 4, "allow_local_sgd": True})
    line = check_args(["--data", "d", "--out", "o", "--elastic", *extra])
    assert line is not None and "--elastic" in line
    assert check_args(["--data", "d", "--out", "o", "--elastic"]) is None


def test_elastic_with_balance_is_one_error_line(tmp_path):
    r = trainer(["--data", tmp_path, "--out", tmp_path / "o", "--elastic", "--balance"])
    lines = error_lines(r.stderr)
    assert r.returncode == 2 and len(lines) == 1
    assert lines[0].startswith("ddplab: error: --elastic with --balance")


def test_newest_valid_skips_a_torn_copy_and_save_bytes_writes_a_matching_checksum(tmp_path):
    checkpoint.save(tmp_path, 10, {"step": 10})
    checkpoint.save(tmp_path, 20, {"step": 20})
    assert elastic.newest_valid(tmp_path)[0] == 20
    torn = checkpoint.ckpt_dir(tmp_path) / "step_000020.pt"
    torn.write_bytes(torn.read_bytes()[:-5])
    assert elastic.newest_valid(tmp_path)[0] == 10
    data = (checkpoint.ckpt_dir(tmp_path) / "step_000010.pt").read_bytes()
    checkpoint.save_bytes(tmp_path / "copy", 10, data)
    copy = checkpoint.ckpt_dir(tmp_path / "copy") / "step_000010.pt"
    assert elastic.newest_valid(tmp_path / "copy") == (10, copy) and copy.read_bytes() == data


def test_the_position_moves_to_another_world_size_without_skipping_or_repeating(small_shards):
    """3 ranks for 4 steps, then 2 ranks from the saved position: together, step by step, they read the
    same tokens as one stream read in order."""
    ds, B, T = open_dataset(small_shards), 2, 8
    seen = []
    three = [elastic.UniformStream(ds, r, 3, B, T) for r in range(3)]
    for _ in range(4):
        seen += [x for ld in three for x in ld.next_batch()[0]]
    pos = three[0].state_dict()
    assert all(ld.state_dict() == pos for ld in three)
    two = [elastic.UniformStream(ds, r, 2, B, T) for r in range(2)]
    for ld in two:
        ld.load_state_dict(pos)
    for _ in range(5):
        seen += [x for ld in two for x in ld.next_batch()[0]]
    one = SharedStreamLoader(ds, 0, T)
    n = 4 * 3 * B + 5 * 2 * B
    expected = one.next_batch([n])[0]
    assert torch.equal(torch.stack(seen), expected)
    assert np.isclose(two[0].state_dict()["offset"] + two[0].state_dict()["epoch"] * one.total, n * T)
