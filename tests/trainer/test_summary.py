"""summary.rank{R}.json and summary.json from hand-made step records (no process group, no torch)."""

import pytest

from trainer.summary import RANK_KEYS, TIMING_KEYS, rank_summary, run_summary


def _rec(step, dt_ms, loss, allreduce_ms=10.0, exposed_ms=2.0, tokens=1000):
    return {"step": step, "loss": loss, "dt_ms": dt_ms, "tokens": tokens, "allreduce_ms": allreduce_ms,
            "exposed_ms": exposed_ms, "compute_ms": dt_ms - exposed_ms, "allreduce_bytes": 4096}


def _rank(rank, sha, dt_ms=100.0, host=None):
    recs = [_rec(1, 900.0, 5.0), _rec(2, dt_ms, 4.0), _rec(3, dt_ms, 3.5)]
    return rank_summary(rank=rank, host=host or f"node{rank}", records=recs, timing_skip=1, loss_first=5.0,
                        final_param_sha256=sha, row_groups_read={rank + 2, rank},
                        data_position={"epoch": 0, "k": 1, "row": 0, "tok": 7, "rank": rank, "world_size": 2})


def test_rank_summary_leaves_out_the_warmup_steps():
    s = _rank(0, "a" * 64)
    assert s["steps_run"] == 3 and s["timed_steps"] == 2
    assert s["loss_first"] == 5.0 and s["loss_last"] == 3.5
    assert s["tokens_per_sec"] == pytest.approx(2000 / 0.2)  # the 900 ms first step is not timed
    assert s["step_ms_p50"] == 100.0 and s["allreduce_bytes_per_step"] == 4096
    assert s["comm_compute_ratio"] == pytest.approx(20.0 / 196.0)
    assert s["row_groups_read"] == [0, 2] and s["data_position"]["tok"] == 7


def test_rank_summary_of_a_run_that_had_no_steps_left():
    s = rank_summary(rank=1, host="node1", records=[], timing_skip=2, loss_first=4.2,
                     final_param_sha256="b" * 64, row_groups_read=set(), data_position={})
    assert s["steps_run"] == 0 and s["loss_last"] is None and "tokens_per_sec" not in s
    run = run_summary([s], {"run_id": "r"})
    assert all(run[k] is None for k in TIMING_KEYS) and run["loss_first"] == 4.2


def test_run_summary_byte_equivalent_only_when_every_checksum_matches():
    facts = {"run_id": "run-1", "world_size": 3, "hosts": ["node0", "node1", "node2"]}
    same = [_rank(r, "c" * 64, dt_ms=100.0 + 10 * r) for r in range(3)]
    ok = run_summary(same, facts)
    assert ok["byte_equivalent"] is True and ok["final_param_sha256"] == "c" * 64
    assert ok["run_id"] == "run-1" and ok["hosts"] == facts["hosts"]
    assert ok["step_ms_p50"] == 100.0  # rank 0's timing
    assert [r["step_ms_p50"] for r in ok["ranks"]] == [100.0, 110.0, 120.0]
    assert all(set(r) == set(RANK_KEYS) for r in ok["ranks"])

    differ = same[:2] + [_rank(2, "d" * 64)]
    bad = run_summary(differ, facts)
    assert bad["byte_equivalent"] is False and bad["final_param_sha256"] == "c" * 64
