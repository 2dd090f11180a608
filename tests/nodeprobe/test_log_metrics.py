"""nodeprobe/log_metrics.py: progress and metrics read from the lines a user's code prints.

The test lines are made by nanoGPT's and nanochat's real print statements (tests/helpers/user_logs.py).
"""

import json
import math
import re
from pathlib import Path

import pytest

from nodeprobe import log_metrics as lm
from tests.helpers.user_logs import RUN_LINE, nanochat_log, nanogpt_iter, nanogpt_log, write


# --- built-in formats ------------------------------------------------------------------------------
def test_nanogpt_lines_give_steps_loss_total_and_tokens_per_second(tmp_path):
    log = lm.read_log(write(tmp_path / "launch.log", nanogpt_log()))
    assert log["format"] == "nanogpt"
    assert log["context"] == {"total": 6, "tokens_per_step": 3072}  # the override wins over the file's 5000
    train = [r for r in log["records"] if "loss" in r]
    assert [r["step"] for r in train] == list(range(7))
    assert train[-1]["loss"] == pytest.approx(3.4) and train[-1]["dt_ms"] == pytest.approx(106.0)
    assert train[-1]["mfu"] == pytest.approx(1.23)
    assert train[-1]["tokens_per_sec"] == pytest.approx(3072 / 0.106)  # tokens per iteration / step time
    assert [r["val_loss"] for r in log["records"] if "val_loss" in r] == pytest.approx([4.3, 4.0, 3.7])
    s = lm.summary(log["records"])
    assert s["last_step"] == 6 and s["final_loss"] == pytest.approx(3.4)
    assert s["val_loss"] == pytest.approx(3.7)
    assert s["step_ms_p50"] == pytest.approx(103.5)  # iter 0 (500 ms, compile and eval) is warm-up
    p = lm.progress(log["records"], log["context"])
    assert p["step"] == 6 and p["total"] == 6 and p["eta_s"] == 0


def test_nanochat_lines_with_separators(tmp_path):
    log = lm.read_log(write(tmp_path / "launch.log", nanochat_log(upto=12)))
    assert log["format"] == "nanochat"
    train = [r for r in log["records"] if "loss" in r]
    assert len(train) == 12 and train[-1]["step"] == 11 and train[-1]["total"] == 20
    assert "eta: " in nanochat_log(upto=12)[-1] and "," in nanochat_log(upto=12)[-1]  # as printed
    assert train[-1]["tokens_per_sec"] == int(524288 / 0.261) and train[-1]["tokens_per_sec"] > 1000
    assert train[-1]["loss"] == pytest.approx(9.3) and train[-1]["dt_ms"] == pytest.approx(261.0)
    assert [r["val_bpb"] for r in log["records"] if "val_bpb" in r] == pytest.approx([3.0, 2.9])
    p = lm.progress(log["records"], log["context"])
    assert (p["step"], p["total"]) == (11, 20)
    assert p["eta_s"] == pytest.approx(9 * 0.256, rel=0.01)  # median step time of the steps after the first
    s = lm.summary(log["records"])
    assert s["tokens_per_sec"] == pytest.approx(int(524288 / 0.256), rel=0.01)


def test_the_first_lines_of_a_long_log_still_give_the_total(tmp_path):
    lines = nanogpt_log(max_iters=3000)
    path = write(tmp_path / "launch.log", lines)
    assert (tmp_path / "launch.log").stat().st_size > lm.HEAD_BYTES + lm.TAIL_BYTES
    tail = lm.read_log(path)
    assert tail["context"]["total"] == 3000 and tail["records"][-1]["step"] == 3000
    assert len(tail["records"]) < 3000  # only the end was read
    assert len(lm.read_log(path, whole=True)["records"]) == 3001 + 1001


# --- a custom pattern ------------------------------------------------------------------------------
CUSTOM = (r"^ep (?P<step>\d+) of (?P<total>\d+) loss=(?P<loss>\S+) speed=(?P<tokens_per_sec>[\d,.]+) tok/s "
          r"\((?P<dt_ms>[\d.]+) ms\)")


def test_a_custom_pattern_wins_over_the_built_in_formats(tmp_path):
    lines = nanochat_log(upto=3) + ["ep 7 of 10 loss=1.5 speed=12,345.5 tok/s (80.0 ms)",
                                    "ep 8 of 10 loss=nan speed=12,000 tok/s (81.0 ms)"]
    log = lm.read_log(write(tmp_path / "launch.log", lines), CUSTOM)
    assert log["format"] == "custom"
    assert log["records"] == [{"step": 7, "total": 10, "loss": 1.5, "tokens_per_sec": 12345.5, "dt_ms": 80.0},
                              {"step": 8, "total": 10, "tokens_per_sec": 12000.0, "dt_ms": 81.0}]  # nan: none
    p = lm.progress(log["records"], log["context"])
    assert p["loss"] == 1.5 and p["eta_s"] == pytest.approx(2 * 0.081)
    json.dumps(p, allow_nan=False)


@pytest.mark.parametrize("pattern, says", [
    (r"step (\d+", "is not a Python regex"),
    (r"step (?P<stp>\d+) (?P<lr>\S+)", "unknown group name(s) lr, stp"),
    (r"loss (?P<loss>\S+)", "has no (?P<step>...) group"),
])
def test_a_bad_custom_pattern_is_refused(pattern, says):
    with pytest.raises(lm.PatternError, match=re.escape(says)):
        lm.custom_format(pattern)


# --- what is not a metrics line --------------------------------------------------------------------
def test_garbage_prefixes_and_other_attempts(tmp_path):
    earlier = nanochat_log(upto=5)
    now = [RUN_LINE, "Traceback (most recent call last):", "step one of many", "iter x: loss y",
           "\x00\xff binary", "[rank0]:" + nanogpt_iter(4, 2.5, 0.2, 0.01),
           "[default0]:" + nanogpt_iter(5, 2.4, 0.2, 0.01)]
    log = lm.read_log(write(tmp_path / "launch.log", earlier + now))
    assert log["format"] == "nanogpt"  # the earlier attempt's nanochat lines are not this attempt's
    assert [(r["step"], r["loss"]) for r in log["records"]] == [(4, 2.5), (5, 2.4)]
    assert lm.read_log(write(tmp_path / "none.log", [RUN_LINE, "hello", "step 3"])) == \
        {"format": None, "records": [], "context": {}}
    assert lm.read_log(str(tmp_path / "missing.log"))["records"] == []


def test_the_built_in_trainers_progress_line_reads_with_its_all_reduce():
    from trainer.metrics import progress_line

    rec = {"step": 12, "loss_mean": 2.5, "lr": 1e-3, "dt_ms": 100.0, "tokens_per_sec": 12345.0,
           "allreduce_ms": 3.0}
    local = {**rec, "step": 13, "val_loss": 2.75}
    del local["loss_mean"]
    local["loss"] = 2.25  # between local-SGD syncs only rank 0's own loss is known
    lines = [progress_line(rec, 50, 30.0), progress_line(local, 50, None)]
    fmt = lm.choose(lines)
    assert fmt.name == "ddplab"
    records, _ = lm.parse(lines, fmt)
    assert records == [
        {"step": 12, "total": 50, "loss": 2.5, "dt_ms": 100.0, "tokens_per_sec": 12345.0,
         "allreduce_ms": 3.0},
        {"step": 13, "total": 50, "loss": 2.25, "val_loss": 2.75, "dt_ms": 100.0, "tokens_per_sec": 12345.0,
         "allreduce_ms": 3.0}]
    # the user formats never read it
    assert not any(f.patterns[0].search(lines[0]) for f in lm.BUILTIN if f.name != "ddplab")


def test_a_partial_last_line_is_left_out(tmp_path):
    lines = nanochat_log(upto=3)
    cut = lines[-1][:lines[-1].index("tok/sec: ") + len("tok/sec: ") + 2]  # "tok/sec: 2," mid-number
    log = lm.read_log(write(tmp_path / "launch.log", lines[:-1] + [cut], newline=False))
    assert [r["step"] for r in log["records"] if "loss" in r] == [0, 1]
    assert lm.number(float, "1,234,567.5") == 1234567.5 and lm.number(int, "1_000") == 1000
    assert lm.number(float, "inf") is None and not math.isnan(lm.number(float, "-1.5"))


def test_the_documented_examples_are_usable_patterns():
    from ddplab.settings.spec import BY_NAME

    readme = (Path(__file__).resolve().parents[2] / "docs" / "your-code.md").read_text()
    shown = re.search(r"e\.g\.\s+`'(\^step [^`]+)'`", readme).group(1)
    for text in (BY_NAME["ddplab_log_pattern"].example, shown):
        fmt = lm.custom_format(text)
        assert lm.parse(["step 12/20 loss 2.5 1,234"], fmt)[0][0]["step"] == 12
