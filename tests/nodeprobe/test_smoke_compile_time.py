"""The smoke run's limit does not count torch.compile (nodeprobe/smoke_launch.py compile_seconds): the seconds
the slowest rank spent compiling, an ongoing compile included, up to MAX_COMPILE_S."""

from nodeprobe.smoke_judge import compiling
from nodeprobe.smoke_launch import MAX_COMPILE_S, compile_seconds


def test_the_slowest_ranks_compile_is_credited_an_ongoing_one_included():
    recs = [{"compile_s": 30.0}, {"compile_s": 10.0, "compiling_since": 100.0}, {}]
    assert compile_seconds(recs, now=150.0) == 60.0  # rank 1: 10 s done + 50 s still compiling
    assert compile_seconds(recs, now=105.0) == 30.0
    assert compile_seconds([], now=1.0) == 0.0


def test_a_compile_that_never_ends_is_credited_up_to_the_cap():
    assert compile_seconds([{"compiling_since": 0.0}], now=10 * MAX_COMPILE_S) == MAX_COMPILE_S


def test_the_inconclusive_note_says_the_compile_was_besides_the_limit():
    assert compiling({"compile_s": 52.8}) == " (besides 52.8 s of torch.compile)"
    assert compiling({"compile_s": 0.0}) == ""
