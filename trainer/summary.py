"""What a run reports: `summary.rank{R}.json` on every rank and `summary.json` on rank 0.

Pure functions of the step records and of facts about the run, so they are tested on hand-made
inputs; train.py gathers the inputs across ranks and writes the files (keys: docs/contracts.md).
"""

from __future__ import annotations

from trainer.metrics import summarize_steps

# rank 0's timing, copied into the run summary (a rank's view of the whole run's step)
TIMING_KEYS = ("tokens_per_sec", "allreduce_ms_p50", "allreduce_ms_p95", "step_ms_p50", "compute_ms_p50",
               "exposed_ms_p50", "allreduce_bytes_per_step", "comm_compute_ratio")
# each rank's headline numbers, listed in the run summary
RANK_KEYS = ("rank", "host", "tokens_per_sec", "step_ms_p50", "loss_last", "compute_ms_p50", "wait_ms_p50",
             "share_last", "peak_rss_bytes")


def rank_summary(*, rank: int, host: str, records: list[dict], timing_skip: int, loss_first: float | None,
                 final_param_sha256: str, row_groups_read: list[int], data_position: dict) -> dict:
    """One rank's summary: what it ran, read and ended with, and its timing after `timing_skip` steps."""
    timing = summarize_steps(records, timing_skip) if records else {}
    return {"rank": rank, "host": host, "steps_run": len(records), "loss_first": loss_first,
            "loss_last": records[-1]["loss"] if records else None,
            # the loss over every rank (weighted by share) at the last step; loss_first is that mean too
            "loss_mean_last": records[-1].get("loss_mean") if records else None,
            "final_param_sha256": final_param_sha256, "row_groups_read": sorted(row_groups_read),
            "data_position": data_position,
            # share: sequences of the global batch this rank trained on (changes with --balance)
            "share_last": records[-1].get("share") if records else None} | timing


def run_summary(per_rank: list[dict], facts: dict) -> dict:
    """The run summary from every rank's summary (rank order) and the run's facts (run id, sizes, dtype...).

    byte_equivalent is true only when every rank ended with the same parameter checksum.
    """
    first = per_rank[0]
    return {
        **facts,
        **{k: first.get(k) for k in TIMING_KEYS},
        "byte_equivalent": len({r["final_param_sha256"] for r in per_rank}) == 1,
        "final_param_sha256": first["final_param_sha256"],
        "loss_first": first["loss_first"],
        "loss_last": first["loss_last"] if first.get("loss_mean_last") is None else first["loss_mean_last"],
        "ranks": [{k: r.get(k) for k in RANK_KEYS} for r in per_rank],
    }
