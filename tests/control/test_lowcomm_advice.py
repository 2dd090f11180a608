"""The run report's low-communication advice (ddplab/lowcomm_advice.py) against the committed long study
(bench/results/lowcomm-stdlib/report.json, with its codec timing; a study without one borrows
bench/results/lowcomm/'s): when it speaks, what it offers, and the step it estimates."""

from __future__ import annotations

import json

import pytest

from ddplab import lowcomm_advice as L

STUDY = L.load_study()
# a per-step DDP run of 2 ranks: rank 0's timing, as the trainer's summary.json holds it
RUN = {"world_size": 2, "local_sgd": None, "params": 459_008, "step_ms_p50": 100.0, "exposed_ms_p50": 60.0}


def test_the_committed_study_is_read_with_its_own_wire_measurement():
    assert STUDY is not None and STUDY["corpus"]["name"] == "stdlib"
    assert [t["fewer_bytes"] for t in STUDY["targets"]] == [16, 100]
    assert STUDY["wire"] == L._read(L.STUDY)["wire"] and STUDY["wire"]["numel"] > 0


def test_a_study_without_its_own_wire_measurement_borrows_the_built_in_corpus_one(tmp_path):
    bare = tmp_path / "study.json"
    bare.write_text(json.dumps({k: v for k, v in L._read(L.STUDY).items() if k != "wire"}))
    assert L.load_study(bare)["wire"] == L._read(L.WIRE)["wire"]
    assert L.load_study(bare, wire=tmp_path / "missing.json") is None  # codecs not timed: no section


@pytest.mark.parametrize("change", [
    {"exposed_ms_p50": 15.0},                 # 15 % of the step: below SPEAK_FROM
    {"world_size": 1},                        # nothing to communicate
    {"local_sgd": {"sync_every": 16}},        # already syncs less than every step
    {"comm": "bf16", "comm_chosen": "bf16"},  # already sends fewer bytes than the study's reference
    {"comm_chosen": "powersgd"},
    {"exposed_ms_p50": None},                 # no timing (your own code's run)
    {"step_ms_p50": None},
])
def test_nothing_is_said_without_a_communication_bound_per_step_run(change):
    assert L.advice({**RUN, **change}, STUDY) is None


def test_nothing_is_said_without_the_study(tmp_path):
    assert L.load_study(tmp_path / "missing.json") is None
    assert L.advice(RUN, None) is None


def test_each_target_offers_the_studys_best_setting_with_its_measured_cost_and_whether_it_met_it():
    a = L.advice(RUN, STUDY)
    assert a["exposed_share"] == pytest.approx(0.6)
    assert [o["mode"] for o in a["options"]] == [t["best_mode"] for t in STUDY["targets"]]
    for option, target in zip(a["options"], STUDY["targets"], strict=True):
        mode = STUDY["modes"][target["best_mode"]]
        assert option["flags"] == mode["flags"] and option["val_loss_vs_ddp"] == mode["val_loss_vs_ddp"]
        assert option["fewer_bytes"] >= target["fewer_bytes"] and option["target"]["met"] is target["met"]


def test_without_a_codec_the_step_estimate_shrinks_only_the_exposed_all_reduce():
    """bf16 is a cast, not a codec the study timed: only the bytes shrink."""
    plain = [o for o in L.advice(RUN, STUDY)["options"] if L._flag(o["flags"], "--comm", "fp32")
             not in L.CODEC_OPS]
    assert plain
    for o in plain:
        assert o["step_ms_estimate"] == pytest.approx(100.0 - 60.0 + 60.0 / o["fewer_bytes"])
        assert o["speedup_estimate"] == pytest.approx(100.0 / o["step_ms_estimate"])


def test_a_codec_costs_its_measured_cpu_time_per_value_once_per_sync():
    """int4's encode and decode, measured in the study on its model, scaled to this run's parameters: on a
    model whose codec time per step is twice the exposed all-reduce (about 124M parameters at the study's
    timing), it costs more than the bytes it saves, and the estimate says so."""
    per_value = L.codec_ms_per_value(STUDY, "int4")
    ops = STUDY["wire"]["ops"]
    assert per_value == pytest.approx((ops["int4 encode + all-gather + decode"]["ms_median"]
                                       - ops["int4 all-gather (codes + scales)"]["ms_median"])
                                      / STUDY["wire"]["numel"])
    assert L.codec_ms_per_value(STUDY, "fp32") == 0.0
    small = L.advice({**RUN, "params": 459_008}, STUDY)
    int4_small = next(o for o in small["options"] if "int4" in o["flags"])
    syncs = STUDY["modes"][int4_small["mode"]]["outer_steps"] / STUDY["steps"]  # about 1/H
    large = L.advice({**RUN, "params": int(2 * RUN["exposed_ms_p50"] / syncs / per_value)}, STUDY)
    int4 = [next(o for o in a["options"] if "int4" in o["flags"]) for a in (small, large)]
    fewer = int4[0]["fewer_bytes"]
    assert int4[0]["step_ms_estimate"] == pytest.approx(40.0 + 60.0 / fewer + per_value * 459_008 * syncs)
    assert int4[1]["speedup_estimate"] < 1 < int4[0]["speedup_estimate"]


def test_the_report_section_names_the_flags_the_cost_and_the_study():
    a = L.advice(RUN, STUDY)
    text = "\n".join(L.markdown(a))
    assert "The exposed all-reduce took 60% of a step (60.0 of 100.0 ms" in text
    assert "bench/results/lowcomm-stdlib/report.md: stdlib corpus" in text
    assert f"{STUDY['steps']} steps" in text
    for o in a["options"]:
        assert f"`{' '.join(o['flags'])}`" in text and f"{o['speedup_estimate']:.2f}x" in text
    for o in a["options"]:
        assert ("| met: " if o["target"]["met"] else "| not met: ") + f"{o['target']['fewer_bytes']}x" in text
    first = L.try_first(a["options"])
    assert text.endswith(f"Try first: {first['label']} (`{' '.join(first['flags'])}`, in "
                         "ddplab_trainer_extra_args).")


def _option(loss: float, speedup: float, met: bool = True) -> dict:
    return {"val_loss_vs_ddp": {"median": loss}, "speedup_estimate": speedup, "target": {"met": met}}


def test_try_first_takes_the_smaller_loss_unless_another_setting_is_clearly_faster():
    safe, fast = _option(1.007, 2.56), _option(1.020, 2.59)
    assert L.try_first([safe, fast]) is safe  # 1 % faster is not worth +1.3 points of loss
    quick = _option(1.020, 2.56 * L.FASTER_BY)
    assert L.try_first([safe, quick]) is quick
    assert L.try_first([safe, _option(1.0, 9.0, met=False)]) is safe  # a missed target is never named
    assert L.try_first([_option(1.0, 9.0, met=False)]) is None


def test_each_setting_says_how_many_outer_steps_this_runs_length_gives_against_the_study():
    a = L.advice({**RUN, "steps": 160}, STUDY)
    for o in a["options"]:
        mode = STUDY["modes"][o["mode"]]
        # the study's syncs per step at this run's length: 160 / H for a constant period
        assert o["outer_steps"] == round(160 * mode["outer_steps"] / STUDY["steps"])
        assert o["study_outer_steps"] == mode["outer_steps"]
        if "--sync-schedule" not in o["flags"]:
            assert abs(o["outer_steps"] - 160 / int(L._flag(o["flags"], "--sync-every", "1"))) <= 1
        assert f"| {o['outer_steps']} / {mode['outer_steps']} |" in "\n".join(L.markdown(a))
