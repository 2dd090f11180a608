"""ddplab/preflight/link_cost.py and the link row (checks_link.py), with the link figures the gloo smoke test
measured on simulated hosts (tests/preflight/test_preflight_simlan.py runs the real thing): a wired link is
never advised, the Wi-Fi-like link of bench/results/wifi is; and nodeprobe/link_quality.py's loss leaves out
the retransmissions the peer reported as duplicates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddplab.preflight import checks_link
from ddplab.preflight.judge import NA, OK
from ddplab.preflight.link_cost import ADVISE_FROM, assess
from nodeprobe.link_quality import lost_share

# the built-in trainer's default model (depth 6, width 384): 10.8 M parameters
SIZES = {"depth": 6, "n_embd": 384, "n_head": 6, "seq_len": 128, "batch_size": 8, "vocab": 257,
         "world_size": 2}
BW_WIRED = {"bytes": 4 << 20, "median_s": 0.013}
BW_WIFI = {"bytes": 4 << 20, "median_s": 4.8}
# measured (2 hosts, load 3-13 on 2 cores): the plain veth link's worst rttvar and the Wi-Fi-like link's
WIRED = {"rtt_ms": 0.3, "rttvar_ms": 0.47, "loss": 0.0, "data_segs_out": 12059}
WIFI = {"rtt_ms": 22.0, "rttvar_ms": 1.9, "loss": 0.0016, "data_segs_out": 11854}


def smoke(link: dict, bw: dict, compute: float | None = 0.7) -> dict:
    return {"ok": True, "world": 2, "link": link, "bandwidth": bw, "compute_step_s": compute}


class FakeJudge:
    """The calls the check makes on a Judge: the node's smoke result and fingerprint, and the cell it sets."""

    def __init__(self, result: dict, sizes: dict | None = SIZES):
        self.result, self.sizes, self.cell = result, sizes, None

    def probe(self, host, name):
        return self.result

    def fp(self, host):
        return {"memory": {"sizes": self.sizes}}

    def set(self, host, check, status, detail="", fix="", note=""):
        self.cell = SimpleNamespace(status=status, detail=detail, fix=fix, note=note)


def judged(result: dict, sizes: dict | None = SIZES) -> SimpleNamespace:
    j = FakeJudge(result, sizes)
    checks_link.link(j, "node1")
    return j.cell


def test_a_wired_link_costs_nothing_and_is_not_advised():
    # no step is timed on a clean link (the node skips it): nothing to weigh
    cost = assess(smoke(WIRED, BW_WIRED, compute=None), SIZES, 2)
    assert cost["share"] == 0.0 and cost["total_s"] == 0.0
    cell = judged(smoke(WIRED, BW_WIRED, compute=None))
    assert (cell.status, cell.note, cell.fix) == (OK, "", "")
    assert "no loss, jitter under 1 ms" in cell.detail and "loss 0.00% of 12059 segments" in cell.detail


def test_the_wifi_like_link_is_advised_a_cable_or_local_sgd():
    cost = assess(smoke(WIFI, BW_WIFI), SIZES, 2)
    assert cost["share"] >= ADVISE_FROM and cost["loss_s"] > cost["jitter_s"] > 0
    cell = judged(smoke(WIFI, BW_WIFI))
    assert (cell.status, cell.note) == (OK, "warning")
    assert cell.fix.startswith("connect node1 with a cable (Ethernet)")
    assert "--sync-every 16 --allow-local-sgd in ddplab_trainer_extra_args" in cell.fix
    assert "loss 0.16% of 11854 segments" in cell.detail and "over the 10% at which" in cell.detail


def test_a_small_loss_on_a_compute_heavy_step_stays_under_the_share():
    link = {**WIFI, "loss": 1e-5, "rttvar_ms": 1.1}
    cost = assess(smoke(link, BW_WIRED, compute=30.0), SIZES, 2)
    assert 0 < cost["share"] < ADVISE_FROM
    assert judged(smoke(link, BW_WIRED, compute=30.0)).note == ""


def test_own_code_or_no_smoke_result_is_not_weighed():
    cell = judged(smoke(WIFI, BW_WIFI, compute=None), sizes=None)
    assert cell.status == OK and "not weighed against a step" in cell.detail and cell.note == ""
    assert judged({"ok": False, "phase": "init"}).status == NA


@pytest.mark.parametrize(("retrans", "dups", "sent", "share"),
                         [(156, 156, 12067, 0.0), (24, 0, 11851, 0.002025), (30, 10, 1000, 0.02),
                          (0, 0, 0, None), (1, 0, 12072, 0.0), (2, 0, 3140, 0.000637)])
def test_loss_leaves_out_duplicates_and_a_single_lost_segment(retrans, dups, sent, share):
    # (1, 0, 12072): a healthy wired link of a loaded CI machine, advised a cable before (one lost segment)
    assert lost_share(retrans, dups, sent) == share
