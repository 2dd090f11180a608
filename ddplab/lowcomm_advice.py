"""The run report's word on low-communication training (issue 30): when a per-step DDP run spent a large
share of each step waiting for its all-reduce, which settings of the long study (`make bench-lowcomm` on
the standard library's source, bench/results/lowcomm-stdlib/report.json: the harder corpus, where the
built-in one hid the costs, docs/scaling.md) send fewer bytes, the validation loss each cost there at equal
tokens, and the step time this run would get with each.

`--comm auto` never changes the optimization by itself; this only says what to try, with measured numbers:
- the loss cost is the study's (its model, steps and seeds are named with it), not a promise for this model;
- the step time is an estimate from this run's own timing, for a link whose bandwidth is the limit: the
  exposed all-reduce (the part of it no compute hid) shrinks with the bytes, and the int8/int4 codecs add
  their CPU time, measured in the study per value and scaled to this model, once per sync.
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
STUDY = RESULTS / "lowcomm-stdlib" / "report.json"
# The codecs' CPU time per value, measured by the study on the built-in corpus (no corpus changes it).
WIRE = RESULTS / "lowcomm" / "report.json"
# The exposed all-reduce's share of a step from which the report speaks up.
SPEAK_FROM = 0.2
# "Try first" names the met setting that cost the least loss, unless another met one is estimated at least
# this much faster: a near tie in speed is not worth a larger loss.
FASTER_BY = 1.1
# The study's wire measurement names the codec of a mode's --comm (the all-gather alone, and with the codec).
CODEC_OPS = {"int8": ("int8 all-gather (codes + scales)", "int8 encode + all-gather + decode"),
             "int4": ("int4 all-gather (codes + scales)", "int4 encode + all-gather + decode")}


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def load_study(path: Path = STUDY, wire: Path = WIRE) -> dict | None:
    """The study, with the wire measurement of `wire` when it has none of its own; None when either is
    missing (the report then has no section: the codecs could not be timed)."""
    study = _read(path)
    if study is not None and not study.get("wire"):
        study["wire"] = (_read(wire) or {}).get("wire")
    return study if study and study.get("wire") else None


def _flag(flags: list[str], name: str, default: str) -> str:
    return flags[flags.index(name) + 1] if name in flags else default


def codec_ms_per_value(study: dict, comm: str) -> float:
    """CPU ms of encoding and decoding one value for `comm`, from the study's wire measurement (0: fp32)."""
    if comm not in CODEC_OPS:
        return 0.0
    ops, (gather, with_codec) = study["wire"]["ops"], CODEC_OPS[comm]
    return max(0.0, ops[with_codec]["ms_median"] - ops[gather]["ms_median"]) / study["wire"]["numel"]


def syncs_per_step(study: dict, mode: dict) -> float:
    """How often `mode` synced every parameter in the study: 1/H, or fewer with a --sync-schedule that
    stretches the period as the learning rate decays (the same share of a run of any length)."""
    return mode["outer_steps"] / study["steps"]


def estimated_step_ms(run: dict, study: dict, mode: dict) -> float:
    """This run's step with `mode`: compute as measured, the exposed all-reduce over the mode's fewer bytes,
    plus the codec once per sync."""
    codec = codec_ms_per_value(study, _flag(mode["flags"], "--comm", "fp32")) * run["params"]
    exposed = run["exposed_ms_p50"]
    return run["step_ms_p50"] - exposed + exposed / mode["fewer_bytes"] + codec * syncs_per_step(study, mode)


def advice(run: dict, study: dict | None) -> dict | None:
    """None when the report has nothing to say: no study, one rank, a run that already syncs less than every
    step or sends other than fp32 gradients (the study's byte ratios are against fp32 DDP), no timing, or an
    exposed all-reduce under SPEAK_FROM of the step. Else the share and, per target of the study (16x fewer
    bytes within 1 %, 100x within 3 %), its best setting, whether it met the target, its loss cost and this
    run's estimate."""
    if not study or (run.get("world_size") or 1) < 2 or run.get("local_sgd"):
        return None
    if (run.get("comm_chosen") or run.get("comm") or "fp32") != "fp32":
        return None
    step, exposed, params = run.get("step_ms_p50"), run.get("exposed_ms_p50"), run.get("params")
    if not step or exposed is None or not params or exposed / step < SPEAK_FROM:
        return None
    options = []
    for target in study["targets"]:
        mode = study["modes"][target["best_mode"]]
        est = estimated_step_ms(run, study, mode)
        options.append({"mode": target["best_mode"], "label": mode["label"], "flags": mode["flags"],
                        "fewer_bytes": mode["fewer_bytes"], "val_loss_vs_ddp": mode["val_loss_vs_ddp"],
                        "target": {"fewer_bytes": target["fewer_bytes"], "val_loss_within":
                                   target["val_loss_within"], "met": target["met"]},
                        "step_ms_estimate": est, "speedup_estimate": step / est,
                        # outer steps (syncs) at this run's length, against the study's: short runs pay more
                        "outer_steps": round((run.get("steps") or 0) * syncs_per_step(study, mode)),
                        "study_outer_steps": mode["outer_steps"]})
    depth = _flag(study["model_args"], "--depth", "?")
    return {"exposed_share": exposed / step, "step_ms_p50": step, "exposed_ms_p50": exposed,
            "options": options,
            "study": {"path": f"bench/results/{STUDY.parent.name}/report.md",
                      "corpus": (study.get("corpus") or {}).get("name", "built-in"), "steps": study["steps"],
                      "seeds": study["seeds"], "depth": depth, "when": study["when"]}}


def _pct(ratio: float) -> str:
    return f"{(ratio - 1) * 100:+.1f} %"


def _target(t: dict) -> str:
    return (f"{'met' if t['met'] else 'not met'}: {t['fewer_bytes']}x fewer bytes within "
            f"{t['val_loss_within']:.0%}")


def try_first(options: list[dict]) -> dict | None:
    """Of the settings that met their target: the one that cost the least loss in the study, or the fastest
    estimate if it is at least FASTER_BY faster than that one."""
    met = [o for o in options if o["target"]["met"]]
    if not met:
        return None
    safest = min(met, key=lambda o: o["val_loss_vs_ddp"]["median"])
    fastest = max(met, key=lambda o: o["speedup_estimate"])
    return fastest if fastest["speedup_estimate"] >= FASTER_BY * safest["speedup_estimate"] else safest


def markdown(a: dict, heading: str = "## Communication") -> list[str]:
    """The report's section for an advice()."""
    s = a["study"]
    lines = ["", heading,
             f"The exposed all-reduce took {a['exposed_share']:.0%} of a step ({a['exposed_ms_p50']:.1f} of "
             f"{a['step_ms_p50']:.1f} ms, medians). Settings that send fewer bytes, with the validation loss "
             f"each cost at equal tokens in the long study ({s['path']}: {s['corpus']} corpus, depth "
             f"{s['depth']}, {s['steps']} steps, seeds {', '.join(map(str, s['seeds']))}) and this run's "
             "step estimated with each (bandwidth-bound link; codec CPU time included). A cost measured on "
             "that model, not yours, and over at least 100 outer steps: a run with fewer syncs pays more "
             "(docs/scaling.md). Compare on your own run before you rely on it.", "",
             "| setting | add these flags | bytes vs DDP | val loss vs DDP in the study, median (min to max) "
             "| the study's target | outer steps: this run's length / the study | step ms, estimated "
             "| speed-up, estimated |", "|---" * 8 + "|"]
    for o in a["options"]:
        loss = o["val_loss_vs_ddp"]
        lines.append(f"| {o['label']} | `{' '.join(o['flags'])}` | 1/{o['fewer_bytes']:.0f} | "
                     f"{_pct(loss['median'])} ({_pct(loss['min'])} to {_pct(loss['max'])}) | "
                     f"{_target(o['target'])} | {o['outer_steps']} / {o['study_outer_steps']} | "
                     f"{o['step_ms_estimate']:.1f} | {o['speedup_estimate']:.2f}x |")
    best = try_first(a["options"])
    if best and best["speedup_estimate"] > 1:
        flags = " ".join(best["flags"])
        lines += ["", f"Try first: {best['label']} (`{flags}`, in ddplab_trainer_extra_args)."]
    return lines
