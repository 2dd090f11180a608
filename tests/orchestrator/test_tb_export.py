"""TensorBoard event files from `python -m ddplab report`, read back with tensorboard's EventAccumulator."""

import json
import subprocess
import sys

import pytest

from ddplab import report, tb_export
from tests.helpers.playbooks import REPO

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def write_run(run):
    """2 ranks, 4 steps of 100 tokens; loss_mean on steps 2 and 4, val_loss at 200 and 400 tokens."""
    for rank in (0, 1):
        d = run / f"node{rank}" / "out"
        d.mkdir(parents=True)
        (run / f"node{rank}" / "exit_code").write_text("0\n")
        rows = []
        for i in range(4):
            r = {"step": i + 1, "loss": 5.0 - i - rank / 10, "dt_ms": 10.0, "tokens": 100,
                 "tokens_seen": 100 * (i + 1), "tokens_per_sec": 1000.0 + rank, "allreduce_ms": 1.0}
            if i % 2:
                r |= {"loss_mean": 5.0 - i - 0.05, "val_loss": 4.5 - i}
            rows.append(r)
        (d / f"metrics.rank{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "node0" / "out" / "summary.json").write_text(json.dumps({"world_size": 2, "val_loss": 1.5}))


def read(folder, tag):
    ea = EventAccumulator(str(folder))
    ea.Reload()
    return [(e.step, round(e.value, 4)) for e in ea.Scalars(tag)]


def test_report_writes_event_files_per_rank_and_for_the_run(tmp_path):
    run = tmp_path / "run-tb"
    write_run(run)
    for _ in range(2):  # a second report replaces the files, it does not add to them
        proc = subprocess.run([sys.executable, "-m", "ddplab", "report", str(run)], cwd=REPO, text=True,
                              capture_output=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
    tb = run / "tb"
    assert read(tb / "rank1", "train/loss") == [(1, 4.9), (2, 3.9), (3, 2.9), (4, 1.9)]
    assert read(tb / "rank0", "train/tokens_per_sec") == [(s, 1000.0) for s in (1, 2, 3, 4)]
    assert read(tb / "run", "train/loss_mean") == [(2, 3.95), (4, 1.95)]
    assert read(tb / "run", "val/loss") == [(2, 3.5), (4, 1.5)]
    assert read(tb / "run", "val/loss_vs_tokens") == [(200, 3.5), (400, 1.5)]
    assert read(tb / "run", "train/loss_mean_vs_tokens") == [(200, 3.95), (400, 1.95)]
    assert len(list((tb / "run").iterdir())) == 1
    md = (run / "report.md").read_text()
    assert f"- TensorBoard: `tensorboard --logdir {tb}`" in md and "- val_loss: 1.5" in md
    assert "- logs collected from: node0, node1\n" in md  # the export's folder is no host
    assert "tensorboard" not in proc.stderr


def test_without_tensorboard_the_report_says_once_how_to_get_it(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run-no-tb"
    write_run(run)
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard...` raises ImportError
    assert not tb_export.available()
    report.write_report(run)
    err = capsys.readouterr().err
    assert err.count("pip install 'ddplab[tensorboard]'") == 1 and err.startswith("ddplab: note:")
    assert not (run / "tb").exists() and (run / "report.md").exists()


def test_old_metrics_without_tokens_seen_count_tokens_from_the_steps():
    rows = [{"step": s, "loss": 1.0, "tokens": 64} for s in (1, 2, 3)]
    rows[2]["val_loss"] = 2.0
    got = tb_export.scalars([{"rank": 0, "rows": rows}])
    assert got["run"]["val/loss_vs_tokens"] == [(192, 2.0)]


def test_records_are_framed_as_tensorboards_writer_frames_them(tmp_path):
    """tb_export frames each record itself (tensorboard's writer module imports tensorboard.summary): the
    same bytes as tensorboard's RecordWriter, CRC-32C of the empty, short and multi-byte inputs alike."""
    import io

    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from tensorboard.summary.writer.record_writer import RecordWriter

    datas = [b"", b"a", bytes(range(256)) * 3, "brain.Event:2 \u00e9".encode()]
    for data in datas:
        assert tb_export.masked_crc32c(data) == masked_crc32c(data), data
        theirs = io.BytesIO()
        RecordWriter(theirs).write(data)
        assert tb_export.record(data) == theirs.getvalue(), data


def test_the_report_does_not_import_tensorboards_writer(tmp_path):
    """The event files come from tensorboard's protos alone: `tensorboard.summary` (with its TensorFlow stub,
    0.25-0.3 s of a report on a loaded control host) is not imported."""
    run = tmp_path / "run-light"
    write_run(run)
    probe = (f"import sys; from ddplab import report; report.write_report({str(run)!r}); "
             "print(sorted(m for m in sys.modules if m.startswith(('tensorboard.summary', "
             "'tensorboard.compat.tensorflow_stub'))))")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, text=True, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
    assert read(run / "tb" / "rank0", "train/loss") == [(1, 5.0), (2, 4.0), (3, 3.0), (4, 2.0)]
