"""The link row: each node's jitter and loss toward its peers, measured by the gloo smoke test, and what they
would cost a step of the run (ddplab/preflight/link_cost.py). Never a failure: a lossy link still trains, so
the row passes with a warning and the advice (a cable, or a low-communication setting) when the cost is at
least ADVISE_FROM of the step."""

from __future__ import annotations

from ddplab.preflight.judge import NA, OK, Judge
from ddplab.preflight.link_cost import ADVISE_FROM, assess
from ddplab.preflight.memory_fit import sizes_known
from nodeprobe.link_quality import JITTER_FLOOR_MS

LOWCOMM = ("--sync-every 16 --allow-local-sgd in ddplab_trainer_extra_args (local SGD/DiLoCo, "
           "docs/scaling.md: one sync every 16 steps, 1/16 of the bytes)")


def advice(h: str) -> str:
    return f"connect {h} with a cable (Ethernet), or, if it must stay on Wi-Fi, {LOWCOMM}"


def measured(link: dict) -> str:
    loss = link.get("loss")
    return (f"jitter (rttvar) {link.get('rttvar_ms') or 0:.2f} ms, round trip {link.get('rtt_ms') or 0:.2f} "
            f"ms, loss {'?' if loss is None else f'{loss:.2%}'} of {link.get('data_segs_out')} segments")


def weighed(cost: dict) -> str:
    ms = {k: f"{cost[k] * 1e3:.0f} ms" for k in ("total_s", "step_s", "loss_s", "jitter_s")}
    return (f"about {ms['total_s']} of a {ms['step_s']} step ({cost['share']:.0%}; loss {ms['loss_s']}, "
            f"jitter {ms['jitter_s']})")


def link(j: Judge, h: str) -> None:
    r = j.probe(h, "gloo_smoke") or {}
    facts = r.get("link")
    if not r.get("ok") or not facts:
        j.set(h, "link", NA, "not measured: the gloo smoke test did not run to its end on this node")
        return
    sizes = ((j.fp(h) or {}).get("memory") or {}).get("sizes")
    cost = assess(r, sizes if sizes_known(sizes) else None, int(r.get("world") or 1))
    if cost is None:
        j.set(h, "link", OK, f"{measured(facts)}; not weighed against a step (the run's model size is "
                             "unknown: your own code, or a single node)")
    elif "step_s" not in cost:
        j.set(h, "link", OK, f"{measured(facts)}: no loss, jitter under {JITTER_FLOOR_MS:g} ms")
    elif cost["share"] >= ADVISE_FROM:
        j.set(h, "link", OK, f"{measured(facts)}: {weighed(cost)}, over the {ADVISE_FROM:.0%} at which "
                             f"preflight speaks up; fix: {advice(h)}", fix=advice(h), note="warning")
    else:
        j.set(h, "link", OK, f"{measured(facts)}: {weighed(cost)}")
