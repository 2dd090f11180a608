"""TensorBoard event files for a collected run: runs/<run_id>/tb/ (`tensorboard --logdir runs/<run_id>/tb`).

Optional: needs the `tensorboard` package (`pip install 'ddplab[tensorboard]'`), and only its protos
(Event, Summary), not TensorFlow or torch. The records are framed here as tensorboard's RecordWriter frames
them (length, masked CRC-32C, data, masked CRC-32C; tests/orchestrator/test_tb_export.py compares the bytes):
importing tensorboard's writer imports tensorboard.summary and its TensorFlow stub (numpy, every summary
plugin), 0.25-0.3 s of every report on a loaded control host, for two small functions. Written from the
metrics `python -m ddplab report` already read (ddplab/report.py), rewritten whole each time:
- tb/rank<R>/: that rank's own train/loss and train/tokens_per_sec, by step;
- tb/run/: the run's numbers from the lowest rank's records: train/loss_mean and val/loss by step, and
  the same against the global token count (train/loss_mean_vs_tokens, val/loss_vs_tokens; x = tokens),
  the axis on which runs with other node counts or modes compare.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import time
from pathlib import Path

INSTALL_HINT = "pip install 'ddplab[tensorboard]'"

DIR = "tb"  # runs/<run_id>/tb/: not a host's folder


def available() -> bool:
    try:
        import tensorboard  # noqa: F401
        from tensorboard.compat.proto import event_pb2, summary_pb2  # noqa: F401
    except ImportError:
        return False
    return True


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C, rotated right by 15 bits, plus a constant."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = CRC32C_TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def record(data: bytes) -> bytes:
    """One TFRecord: uint64 length, its masked CRC, the data, its masked CRC (little-endian)."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc32c(header)) + data + struct.pack("<I", masked_crc32c(data))


def event_file_name(now: float, index: int) -> str:
    """As tensorboard names its event files (`tensorboard --logdir` finds them by the tfevents part)."""
    return f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.{index}"


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

    tb = Path(run_dir) / DIR
    shutil.rmtree(tb, ignore_errors=True)  # a re-run report must not double every point
    now = time.time()
    for index, (name, tags) in enumerate(scalars(ranks).items()):
        events = [event_pb2.Event(wall_time=now, file_version="brain.Event:2",
                                  source_metadata=event_pb2.SourceMetadata(writer="ddplab.tb_export"))]
        for tag, points in tags.items():
            for x, v in points:
                value = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=float(v))])
                events.append(event_pb2.Event(wall_time=now, step=int(x), summary=value))
        (tb / name).mkdir(parents=True)
        with open(tb / name / event_file_name(now, index), "wb") as f:
            f.write(b"".join(record(e.SerializeToString()) for e in events))
    return tb
