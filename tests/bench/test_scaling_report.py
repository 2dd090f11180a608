"""The scaling lab's report: every number in it follows from the JSONL it was built from."""

import json
import random
import statistics
from pathlib import Path

import pytest

from bench import scaling_report

REPO = Path(__file__).resolve().parents[2]

RATE = 1e9
TOKENS = 1024


def write_run(root: Path, label: str, nodes: int, per_node: int, comm: str, steps: int, rng: random.Random,
              warmup=2, skip=0, threads=1, cores=1, nbytes=43_000_000, exposed_ms=(10, 100)):
    d = root / "raw" / "small" / label
    node0 = d / ("local" if nodes == 1 and per_node > 1 else "node0")
    node0.mkdir(parents=True)
    ranks = nodes * per_node
    recs = []
    for step in range(1, steps + 1):
        dt = rng.uniform(800, 1200) * (1 if ranks == 1 else 1.3)
        ar = 0.0 if ranks == 1 else rng.uniform(200, 500)
        exposed = 0.0 if ranks == 1 else rng.uniform(*exposed_ms)
        used = comm if comm != "auto" else ("fp32" if step <= skip else "powersgd")
        recs.append({"step": step, "loss": 5.0 - step * 0.1 + rng.random() * 0.01, "dt_ms": dt,
                     "tokens": TOKENS * ranks, "tokens_per_sec": TOKENS * ranks / dt * 1e3,
                     "compute_ms": dt - exposed, "allreduce_ms": ar, "exposed_ms": exposed,
                     "allreduce_bytes": 0 if ranks == 1 else nbytes, "buckets": 2, "comm": used, "lr": 1e-3})
    (node0 / "metrics.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (node0 / "config.json").write_text(json.dumps({"timing_warmup_steps": warmup, "threads_resolved": threads,
                                                   "depth": 6, "n_embd": 384, "n_head": 6, "seq_len": 128,
                                                   "batch_size": 8}))
    (node0 / "summary.json").write_text(json.dumps({"params": 10_814_208, "comm": comm,
                                                    "comm_chosen": "powersgd" if comm == "auto" else comm,
                                                    "comm_timing_skip_steps": skip}))
    run = {"nodes": nodes, "ranks_per_node": per_node, "comm": comm, "cores_per_node": cores, "where": "x"}
    if nodes == 1 and per_node > 1:
        run["rank0_dir"] = "local"
    (d / "run.json").write_text(json.dumps(run))
    return recs


@pytest.fixture
def bench(tmp_path):
    rng = random.Random(7)
    recs = {
        "1x1": write_run(tmp_path, "1x1", 1, 1, "fp32", 12, rng),
        "1x2": write_run(tmp_path, "1x2", 1, 2, "fp32", 12, rng, cores=2),
        "2x1-fp32": write_run(tmp_path, "2x1-fp32", 2, 1, "fp32", 12, rng),
        "2x1-bf16": write_run(tmp_path, "2x1-bf16", 2, 1, "bf16", 12, rng, nbytes=21_500_000),
        "2x1-auto": write_run(tmp_path, "2x1-auto", 2, 1, "auto", 12, rng, skip=7),
        "2x1-threads": write_run(tmp_path, "2x1-threads", 2, 1, "fp16", 12, rng, threads=2),
    }
    (tmp_path / "meta.json").write_text(json.dumps({"id": "t", "nodes": 2, "rate": "1gbit", "rate_bps": RATE,
                                                    "via": "test", "machine": {"logical_cpus": 2,
                                                                               "physical_cores": 2}}))
    (tmp_path / "probe").mkdir()
    for r in (0, 1):
        (tmp_path / "probe" / f"gloo_smoke.rank{r}.json").write_text(json.dumps({
            "ok": True, "world": 2, "rank": r,
            "bandwidth": {"bytes": 64 << 20, "median_s": 0.56, "busbw_gbit_s": 0.958,
                          "algbw_gbit_s": 0.958, "cores_busy": [0.31, 0.27][r],
                          "machine_cores_busy": [1.23, 1.19][r]}}))
    return tmp_path, recs


def test_rows_follow_from_the_jsonl(bench):
    root, recs = bench
    rep = scaling_report.build(scaling_report.collect(root))
    rows = {r["label"]: r for r in rep["sizes"]["small"]["rows"]}
    assert set(rows) == set(recs)

    def tps(label, skip):
        timed = recs[label][skip:]
        return sum(r["tokens"] for r in timed) / (sum(r["dt_ms"] for r in timed) / 1e3)

    base = tps("1x1", 2)
    for label, row in rows.items():
        skip = 7 if label == "2x1-auto" else 2
        timed = recs[label][skip:]
        ranks = row["ranks"]
        assert row["timed_steps"] == len(timed)
        assert row["tokens_per_sec"] == pytest.approx(tps(label, skip))
        assert row["speedup"] == pytest.approx(tps(label, skip) / base)
        assert row["efficiency"] == pytest.approx(tps(label, skip) / base / ranks)
        for key, field in (("step_ms", "dt_ms"), ("compute_ms", "compute_ms"),
                           ("allreduce_ms", "allreduce_ms"), ("exposed_ms", "exposed_ms")):
            assert row[key] == pytest.approx(statistics.median(r[field] for r in timed))
        assert row["loss_last"] == timed[-1]["loss"]
        if ranks > 1:
            ar_s = statistics.median(r["allreduce_ms"] for r in timed) / 1e3
            nbytes = timed[-1]["allreduce_bytes"]
            assert row["busbw_gbit_s"] == pytest.approx(2 * (ranks - 1) / ranks * nbytes * 8 / ar_s / 1e9)
            assert row["alpha"] == pytest.approx(sum(r["allreduce_ms"] for r in timed) /
                                                 sum(r["compute_ms"] for r in timed))
        if row["nodes"] > 1:
            limit_s = 2 * (ranks - 1) / ranks * row["allreduce_bytes"] * 8 / RATE
            assert row["limit_ms"] == pytest.approx(limit_s * 1e3)
            assert row["link_pct"] == pytest.approx(100 * limit_s / ar_s)
        else:
            assert row["link_pct"] is None  # loopback: no link to compare with
    assert rows["2x1-auto"]["comm_chosen"] == "powersgd"
    e = rep["sizes"]["small"]
    alpha = rows["2x1-fp32"]["alpha"]
    assert e["alpha"] == alpha
    # only at the node counts measured (1 and 2): no curve past what was measured
    assert set(e["predicted_speedup"]) == {1, 2}
    assert e["predicted_speedup"][2] == pytest.approx(2 / (1 + alpha))
    auto, fp32 = rows["2x1-auto"]["tokens_per_sec"], rows["2x1-fp32"]["tokens_per_sec"]
    assert e["auto_vs_fp32"] == pytest.approx(auto / fp32)
    assert e["comm_headroom"] == pytest.approx(rows["2x1-fp32"]["step_ms"] / rows["1x1"]["step_ms"])
    assert e["loss_curves"]["2x1-bf16"] == [(r["step"], r["loss"]) for r in recs["2x1-bf16"]]
    p = rep["probe"]
    assert p["link_pct"] == pytest.approx(100 * (64 << 20) * 8 / RATE / 0.56)


def test_report_files_show_the_same_numbers(bench):
    root, _ = bench
    rep = scaling_report.build(scaling_report.collect(root))
    scaling_report.write(rep, root)
    on_disk = json.loads((root / "report.json").read_text())
    md = (root / "report.md").read_text()
    for row in on_disk["sizes"]["small"]["rows"]:
        assert f"| {row['label']} |" in md and f"| {row['tokens_per_sec']:.1f} [" in md
        if row["link_pct"] is not None:
            assert f"| {row['link_pct']:.1f} |" in md
    assert f"{on_disk['probe']['link_pct']:.1f} % of the link limit" in md
    assert "The transfer kept 0.31, 0.27 of a core busy on the nodes" in md  # rank 0's, then rank 1's
    assert "The whole machine had 1.23 of its 2 CPUs busy meanwhile" in md  # rank 0's reading
    for png in ("scaling.png", "loss.png"):
        head = (root / png).read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n"


def test_threads_beyond_the_cores_of_a_node_are_noted(bench):
    root, _ = bench
    notes = scaling_report.build(scaling_report.collect(root))["notes"]
    assert any(n.startswith("2x1-threads:") and "oversubscribed" in n for n in notes)
    assert not any(n.startswith(("1x1:", "1x2:", "2x1-fp32:")) for n in notes)


def test_cli_refuses_a_folder_without_runs(tmp_path, capsys):
    assert scaling_report.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddplab: error:")


def write_round(root: Path, label: str, k: int, nodes: int, dt_ms: float, comm: str = "fp32", steps: int = 4,
                val: float | None = None, per_node: int = 1):
    """One round of one configuration in the rounds layout, every step taking dt_ms: tokens/s is exact."""
    node0 = root / "raw" / "small" / label / f"round{k}" / "node0"
    node0.mkdir(parents=True)
    recs = [{"step": s, "loss": 3.0, "dt_ms": dt_ms, "tokens": TOKENS * nodes, "compute_ms": dt_ms,
             "allreduce_ms": 0.0, "exposed_ms": 0.0, "allreduce_bytes": 0} for s in range(1, steps + 1)]
    (node0 / "metrics.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (node0 / "config.json").write_text(json.dumps({"timing_warmup_steps": 0}))
    (node0 / "summary.json").write_text(json.dumps({"comm_chosen": comm, "val_loss": val}))
    run = {"nodes": nodes, "ranks_per_node": per_node, "comm": comm, "load_before": [1.0 + k, 1.0, 1.0]}
    (node0.parent / "run.json").write_text(json.dumps(run))


def test_ratios_are_taken_within_each_round_then_summarized(tmp_path):
    # by hand: 1 node 1024 tokens per step, 2 nodes 2048.
    #   round 0: 1x1 1000 ms -> 1024 tok/s, 2x1 1250 ms -> 1638.4 tok/s: speedup 1.6
    #   round 1: 1x1  500 ms -> 2048 tok/s, 2x1 1600 ms -> 1280 tok/s:   speedup 0.625
    #   round 2: 1x1  900 ms -> 1137.8,     2x1 1000 ms -> 2048 tok/s:   speedup 1.8
    # median of the ratios 1.6 [0.625-1.8]; the ratio of the medians would be 1638.4 / 1137.8 = 1.44.
    for k, (solo, pair) in enumerate(((1000, 1250), (500, 1600), (900, 1000))):
        write_round(tmp_path, "1x1", k, 1, solo)
        write_round(tmp_path, "2x1-fp32", k, 2, pair)
    write_round(tmp_path, "2x1-auto", 0, 2, 1000, comm="auto")  # 2048 tok/s: 1.25x fp32 in round 0
    write_round(tmp_path, "2x1-auto", 2, 2, 800, comm="auto")   # 2560 tok/s: 1.25x fp32 in round 2
    (tmp_path / "meta.json").write_text(json.dumps({"id": "r", "nodes": 2}))
    rep = scaling_report.build(scaling_report.collect(tmp_path))
    e = rep["sizes"]["small"]
    rows = {r["label"]: r for r in e["rows"]}
    pair = rows["2x1-fp32"]
    assert e["rounds"] == 3 and pair["rounds"] == 3
    assert pair["speedup"] == pytest.approx(1.6)
    assert (pair["speedup_min"], pair["speedup_max"]) == (pytest.approx(0.625), pytest.approx(1.8))
    assert pair["efficiency"] == pytest.approx(0.8)
    assert pair["tokens_per_sec"] == pytest.approx(1638.4)
    assert pair["tokens_per_sec_min"] == pytest.approx(1280)
    assert pair["tokens_per_sec_max"] == pytest.approx(2048)
    assert rows["1x1"]["speedup"] == pytest.approx(1.0)
    # auto ran in rounds 0 and 2 only: its ratio to fp32 comes from those rounds, 1.25 in both
    assert e["auto_vs_fp32"] == pytest.approx(1.25)
    assert e["auto_vs_fp32_spread"]["n"] == 2
    # headroom: the 2-node step over the 1-node step, per round: 1.25, 3.2, 1.111 -> median 1.25
    assert e["comm_headroom"] == pytest.approx(1.25)
    assert pair["load_before"] == [[1.0, 1.0, 1.0], [2.0, 1.0, 1.0], [3.0, 1.0, 1.0]]
    md = scaling_report.markdown(rep)
    assert "| 2x1-fp32 | fp32 | 3 | 1638.4 [1280-2048] | 1.60 [0.62-1.80] | 0.80 [0.31-0.90] |" in md


def test_validation_loss_is_compared_with_fp32_at_equal_tokens_within_each_round(tmp_path):
    # by hand: fp32 val 2.00, 2.50, 2.00; local16 2.02 (+1 %), 2.45 (-2 %), 2.06 (+3 %) -> median +1 %
    # [-2 %, +3 %]; auto ran 8 steps (not equal tokens): left out; 1x1 is one node: left out
    for k, (fp32, local) in enumerate(((2.00, 2.02), (2.50, 2.45), (2.00, 2.06))):
        write_round(tmp_path, "1x1", k, 1, 1000, val=2.2)
        write_round(tmp_path, "2x1-fp32", k, 2, 1000, val=fp32)
        write_round(tmp_path, "2x1-local16", k, 2, 600, comm="local16", val=local)
        write_round(tmp_path, "2x1-auto", k, 2, 900, comm="auto", steps=8, val=1.0)
    (tmp_path / "meta.json").write_text(json.dumps({"id": "v", "nodes": 2}))
    rep = scaling_report.build(scaling_report.collect(tmp_path))
    e = rep["sizes"]["small"]
    assert set(e["val_vs_fp32"]) == {"2x1-local16"}
    local = e["val_vs_fp32"]["2x1-local16"]
    assert local == pytest.approx({"median": 1.01, "min": 0.98, "max": 1.03, "n": 3})
    rows = {r["label"]: r for r in e["rows"]}
    assert rows["2x1-local16"]["val_loss"] == pytest.approx(2.06)  # the median of 2.02, 2.45, 2.06
    md = scaling_report.markdown(rep)
    assert "against 2x1-fp32, within each round: 2x1-local16 +1.00 % [-2.00 to +3.00]." in md


def test_without_a_2_node_fp32_run_1_node_x_2_ranks_is_the_validation_reference(tmp_path):
    # 1x2 (fp32, world size 2) is the same optimization as 2x1-fp32; it ran in round 0 only (its loss does
    # not depend on the link), so one within-round ratio: 2.10 / 2.00 = +5 %; 1x4 has another world size
    write_round(tmp_path, "1x2", 0, 1, 1000, val=2.00, per_node=2)
    write_round(tmp_path, "1x4", 0, 1, 1000, val=1.50, per_node=4)
    for k, local in enumerate((2.10, 2.30)):
        write_round(tmp_path, "1x1", k, 1, 1000, val=2.2)
        write_round(tmp_path, "2x1-local16-bf16", k, 2, 600, comm="local16-bf16", val=local)
    (tmp_path / "meta.json").write_text(json.dumps({"id": "v", "nodes": 2}))
    rep = scaling_report.build(scaling_report.collect(tmp_path))
    e = rep["sizes"]["small"]
    assert e["val_reference"] == "1x2"
    assert e["val_vs_fp32"] == {"2x1-local16-bf16": pytest.approx({"median": 1.05, "min": 1.05, "max": 1.05,
                                                                    "n": 1})}
    assert "against 1x2, within each round: 2x1-local16-bf16 +5.00 % [+5.00 to +5.00]." in \
        scaling_report.markdown(rep)
    scaling_report.plots(rep, tmp_path)  # speed vs validation loss: drawn where losses were compared
    assert (tmp_path / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _write_local_run(root, comm, chosen, recs):
    """Round 0 of 2x1-<comm> (rank 0's records as given) beside a 1x1 run of 1000 ms steps."""
    node0 = root / "raw" / "small" / f"2x1-{comm}" / "round0" / "node0"
    node0.mkdir(parents=True)
    (node0 / "metrics.rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (node0 / "config.json").write_text(json.dumps({"timing_warmup_steps": 0}))
    (node0 / "summary.json").write_text(json.dumps({"comm_chosen": chosen}))
    (node0.parent / "run.json").write_text(json.dumps({"nodes": 2, "ranks_per_node": 1, "comm": comm,
                                                       "load_before": [1, 1, 1]}))
    write_round(root, "1x1", 0, 1, 1000)


def test_a_local_sgd_row_shows_per_step_means_with_its_syncs_and_one_sync_against_the_link(tmp_path):
    # by hand: 8 timed steps of 1000 ms compute; steps 4 and 8 sync 250 MB in 2500 ms (exposed):
    # step ms mean = (6 * 1000 + 2 * 3500) / 8 = 1625; all-reduce mean = 5000 / 8 = 625; MB/step = 62.5;
    # one sync: bus bytes 2 * (2-1)/2 * 250 MB = 250 MB = 2 Gbit in 2.5 s = 0.8 Gbit/s; limit at 1 Gbit/s
    # 2000 ms = 80 % of the link
    recs = []
    for s in range(1, 9):
        sync = s % 4 == 0
        ms = 2500.0 if sync else 0.0
        recs.append({"step": s, "loss": 3.0, "dt_ms": 1000 + ms, "tokens": 2 * TOKENS, "compute_ms": 1000.0,
                     "allreduce_ms": ms, "exposed_ms": ms, "allreduce_bytes": 250_000_000 if sync else 0,
                     "synced": sync, **({"sync_ms": ms, "sync_wait_ms": 300.0} if sync else {})})
    _write_local_run(tmp_path, "local4-bf16", "bf16", recs)
    (tmp_path / "meta.json").write_text(json.dumps({"id": "l", "nodes": 2, "rate_bps": RATE}))
    rep = scaling_report.build(scaling_report.collect(tmp_path))
    row = {r["label"]: r for r in rep["sizes"]["small"]["rows"]}["2x1-local4-bf16"]
    assert row["step_ms"] == pytest.approx(1625) and row["compute_ms"] == pytest.approx(1000)
    assert row["allreduce_ms"] == pytest.approx(625) and row["allreduce_bytes"] == pytest.approx(62.5e6)
    assert (row["sync_ms"], row["sync_bytes"]) == (2500, 250_000_000)
    assert row["busbw_gbit_s"] == pytest.approx(0.8) and row["link_pct"] == pytest.approx(80)
    assert row["efficiency"] == pytest.approx(1000 / 1625)  # 2048 tokens per 1625 ms over 2 x 1024 tok/s
    assert "2x1-local4-bf16 2500 ms for 250 MB after 300 ms waiting" in scaling_report.markdown(rep)


def test_an_overlapped_local_sgd_row_shows_the_blocked_time_and_no_link_speed(tmp_path):
    # --sync-overlap: steps 2, 4, 6 start a sync (overlapped) and block 400 ms; step 8 (the end) blocks
    # 3000 ms (the pending sync lands, then a blocking one). The transfer ran under the steps, so one
    # sync's ms says nothing of the link: no bus Gbit/s, no % of link. Median blocked ms of the 4: 400.
    recs = []
    for s in range(1, 9):
        point = s % 2 == 0
        ms = (3000.0 if s == 8 else 400.0) if point else 0.0
        recs.append({"step": s, "loss": 3.0, "dt_ms": 1000 + ms, "tokens": 2 * TOKENS, "compute_ms": 1000.0,
                     "allreduce_ms": ms, "exposed_ms": ms, "allreduce_bytes": 250_000_000 if point else 0,
                     "synced": s == 8, "overlapped": point and s < 8, "sync_ms": ms, "sync_wait_ms": 0.0})
    _write_local_run(tmp_path, "local2-avg-ovl", "fp32", recs)
    (tmp_path / "meta.json").write_text(json.dumps({"id": "o", "nodes": 2, "rate_bps": RATE, "node_cpu": 80}))
    rep = scaling_report.build(scaling_report.collect(tmp_path))
    assert "2 simulated nodes (80 % of one core each: the rest" in scaling_report.markdown(rep)  # --node-cpu
    row = {r["label"]: r for r in rep["sizes"]["small"]["rows"]}["2x1-local2-avg-ovl"]
    assert row["sync_overlapped"] is True and row["sync_ms"] == 400.0
    assert row["busbw_gbit_s"] is None and row["link_pct"] is None
    assert row["step_ms"] == pytest.approx((4 * 1000 + 3 * 1400 + 4000) / 8)
    md = scaling_report.markdown(rep)
    assert "2x1-local2-avg-ovl 400 ms for 250 MB blocked (the transfer runs under" in md


def test_a_communication_bound_fp32_run_gets_the_low_communication_advice(tmp_path):
    """The 2-node per-step fp32 row whose exposed all-reduce is most of its step: the report quotes the run
    report's advice (ddplab/lowcomm_advice.py) from the rounds' medians."""
    from ddplab import lowcomm_advice

    rng = random.Random(3)
    write_run(tmp_path, "1x1", 1, 1, "fp32", 12, rng)
    write_run(tmp_path, "2x1-fp32", 2, 1, "fp32", 12, rng, exposed_ms=(700, 800))
    meta = {"id": "c", "nodes": 2, "rate": "100mbit", "rate_bps": 1e8, "via": "test",
            "machine": {"logical_cpus": 2}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    study = lowcomm_advice.load_study()
    rep = scaling_report.build(scaling_report.collect(tmp_path), study)
    entry = rep["sizes"]["small"]
    row = next(r for r in entry["rows"] if r["label"] == "2x1-fp32")
    expected = lowcomm_advice.advice({"world_size": 2, "local_sgd": None, "comm_chosen": "fp32",
                                      "params": entry["params"], "step_ms_p50": row["step_ms"],
                                      "exposed_ms_p50": row["exposed_ms"], "steps": row["steps"]}, study)
    assert expected is not None and entry["lowcomm_advice"] == expected
    text = scaling_report.markdown(rep)
    assert "### small: communication" in text and f"`{' '.join(expected['options'][0]['flags'])}`" in text


def test_a_compute_bound_run_gets_no_advice(bench):
    root, _ = bench
    rep = scaling_report.build(scaling_report.collect(root))
    assert rep["sizes"]["small"]["lowcomm_advice"] is None
    assert "### small: communication" not in scaling_report.markdown(rep)
