"""bench/wifi.py's summary on hand-made rounds (medians and the ratio to wired worked out by hand), and the
committed bench/results/wifi/report.md is the one its report.json renders."""

import argparse
import json
from pathlib import Path

from bench import wifi

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "wifi"


def result(link, rnd, tps, allreduce, rtt=1.0):
    return {"link": link, "round": rnd, "rtt_ms_p50": rtt, "jitter_ms": rtt / 2, "tokens_per_sec": tps,
            "step_ms_p50": 100.0, "allreduce_ms_p50": allreduce}


def test_medians_of_the_rounds_and_the_ratio_to_wired():
    # wired 1000, 1200, 900 -> median 1000; wifi 400, 100, 300 -> 300 (0.30x wired)
    rounds = [result(link, rnd, tps, ar) for rnd, row in enumerate(
        [{"wired": (1000, 10), "via-delayer": (950, 11), "wifi": (400, 200), "poor-wifi": (100, 900)},
         {"wired": (1200, 12), "via-delayer": (990, 12), "wifi": (100, 800), "poor-wifi": (50, 1900)},
         {"wired": (900, 9), "via-delayer": (900, 14), "wifi": (300, 300), "poor-wifi": (90, 1000)}], 1)
        for link, (tps, ar) in row.items()]
    rep = wifi.summarize(rounds, argparse.Namespace(rounds=3, steps=30, warmup=5))
    w = rep["links"]["wifi"]
    assert w["tokens_per_sec"] == {"median": 300, "min": 100, "max": 400, "n": 3}
    assert w["allreduce_ms_p50"]["median"] == 300 and w["vs_wired"] == 0.3
    assert rep["links"]["wired"]["vs_wired"] == 1.0 and rep["links"]["wired"]["shaping"] is None
    assert rep["links"]["poor-wifi"]["shaping"] == {"delay": "6ms", "jitter": "10ms", "loss": "1%"}


def test_the_committed_table_is_the_one_its_data_renders():
    rep = json.loads((RESULTS / "report.json").read_text())
    assert (RESULTS / "report.md").read_text() == wifi.markdown(rep)
    assert list(rep["links"]) == list(wifi.LINKS) and rep["rounds"] >= 3 and (RESULTS / "wifi.png").exists()
