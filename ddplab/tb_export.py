"""TensorBoard event files for a collected run: runs/<run_id>/tb/ (`tensorboard --logdir runs/<run_id>/tb`).

Optional: needs the `tensorboard` package (`pip install 'ddplab[tensorboard]'`), and only its event-file
writer and protos, not TensorFlow or torch. Written from the metrics `python -m ddplab report` already
read (ddplab/report.py), rewritten whole each time:
- tb/rank<R>/: that rank's own train/loss and train/tokens_per_sec, by step;
- tb/run/: the run's numbers from the lowest rank's records: train/loss_mean and val/loss by step, and
  the same against the global token count (train/loss_mean_vs_tokens, val/loss_vs_tokens; x = tokens),
  the axis on which runs with other node counts or modes compare.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

INSTALL_HINT = "pip install 'ddplab[tensorboard]'"

DIR = "tb"  # runs/<run_id>/tb/: not a host's folder


def available() -> bool:
    try:
        import tensorboard.summary.writer.event_file_writer  # noqa: F401
    except ImportError:
        return False
    return True


def _tokens_seen(rows: list[dict]) -> list[int]:
    """The global token count after each step (metrics before tokens_seen existed: the sum of tokens)."""
    out, total = [], 0
    for r in rows:
        total = r.get("tokens_seen", total + (r.get("tokens") or 0))
        out.append(total)
    return out


def scalars(ranks: list[dict]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{run folder: {tag: [(x, value), ...]}} from report.load_run's ranks (each with rank and rows)."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    with_rows = [r for r in ranks if r["rows"]]
    for r in with_rows:
        rows = r["rows"]
        out[f"rank{r['rank']}"] = {
            "train/loss": [(x["step"], x["loss"]) for x in rows if x.get("loss") is not None],
            "train/tokens_per_sec": [(x["step"], x["tokens_per_sec"]) for x in rows
                                     if x.get("tokens_per_sec") is not None]}
    if with_rows:
        rows = with_rows[0]["rows"]
        tokens = _tokens_seen(rows)
        run: dict[str, list[tuple[int, float]]] = {}
        for key, tag in (("loss_mean", "train/loss_mean"), ("val_loss", "val/loss")):
            pts = [(x["step"], t, x[key]) for x, t in zip(rows, tokens, strict=True)
                   if x.get(key) is not None]
            run[tag] = [(s, v) for s, _, v in pts]
            run[tag + "_vs_tokens"] = [(t, v) for _, t, v in pts]
        out["run"] = run
    return out


def write(run_dir: str | Path, ranks: list[dict]) -> Path:
    """Write the event files into run_dir/tb/ (replacing an earlier export); returns that folder."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    tb = Path(run_dir) / DIR
    shutil.rmtree(tb, ignore_errors=True)  # a re-run report must not double every point
    now = time.time()
    for name, tags in scalars(ranks).items():
        w = EventFileWriter(str(tb / name))
        for tag, points in tags.items():
            for x, v in points:
                value = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))])
                w.add_event(event_pb2.Event(wall_time=now, step=int(x), summary=value))
        w.close()
    return tb
