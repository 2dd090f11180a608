"""A lab of two Debian releases from bare to a finished run with the README's commands (issue 50): node0 a
fresh Debian 12 (Python 3.11), node1 a fresh Debian 13 (Python 3.13), one wheelhouse for both Pythons
(`make wheelhouse PYTHONS="3.11 3.13" CUDA_FALLBACK=1`: this machine reaches PyPI but not
download.pytorch.org, so Python 3.13 gets PyPI's CUDA build of torch 2.13.0, 2.8 GB with its NVIDIA
libraries), prepare, then launch: one run whose two ranks meet over gloo across the two Pythons.

Slow and large (a 3 GB wheelhouse, 4 GB installed on node1, minutes of prepare), so it runs only when asked:
DDPLAB_MIXED_RUN=1 .venv/bin/pytest -s tests/stock/test_mixed_releases.py. CI runs the fast part
(tests/simlan/test_simlan_stock.py: the mixed pair comes up, preflight names the Python the wheelhouse
lacks)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from simlan import cluster as simlan
from tests.helpers.playbooks import REPO, make_shards, playbook, tail
from tests.stock.conftest import stock_skip_reason

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

ASKED = os.environ.get("DDPLAB_MIXED_RUN") == "1"
WHEELHOUSE = REPO / "wheelhouse-mixed"  # its own folder: the suite's wheelhouse (3.11 only) stays small


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    if not ASKED:
        pytest.skip("DDPLAB_MIXED_RUN=1 runs it (3 GB wheelhouse, minutes; docs/laptops.md)")
    reason = stock_skip_reason()
    if reason:
        pytest.skip(reason)
    t0 = time.monotonic()
    fill = subprocess.run(["make", "wheelhouse", f"WHEELHOUSE={WHEELHOUSE}", "PYTHONS=3.11 3.13",
                           "CUDA_FALLBACK=1"], cwd=REPO, capture_output=True, text=True, timeout=3600)
    assert fill.returncode == 0, fill.stdout[-3000:] + fill.stderr[-3000:]
    t1 = time.monotonic()
    c = simlan.up(2, stock=True, release=["node1=trixie"], force=True, timeout=20)
    extra = {"ddplab_data_dir": make_shards(tmp_path_factory.getbasetemp() / "shards"),
             "ddplab_runs_dir": tmp_path_factory.mktemp("mixed-runs"), "ddplab_threads": 1,
             "ddplab_wheelhouse_dir": WHEELHOUSE}
    yield {"cluster": c, "extra": extra, "fill_s": t1 - t0}
    simlan.down()


def test_a_debian_12_and_a_debian_13_node_train_one_run(mixed):
    c, extra = mixed["cluster"], mixed["extra"]
    t0 = time.monotonic()
    prep = playbook("prepare.yml", inventory=c.inventory_dir, extra=extra, timeout=3600)
    t1 = time.monotonic()
    assert prep.returncode == 0, tail(prep, 120)
    versions = {h: c.exec(h, ["sh", "-c", "/home/lab/ddplab/venv/bin/python -c 'import sys, torch; "
                              "print(sys.version_info[1], torch.__version__)'"], check=True).stdout.split()
                for h in ("node0", "node1")}
    assert versions == {"node0": ["11", "2.13.0+cpu"], "node1": ["13", "2.13.0+cu130"]}, versions
    run = playbook("launch.yml", inventory=c.inventory_dir, timeout=1800,
                   extra={**extra, "ddplab_wait": "true", "ddplab_trainer_steps": 5, "ddplab_run_id": "mixed",
                          "firewall_enable": "true"})
    t2 = time.monotonic()
    assert run.returncode == 0, tail(run, 120)
    summary = json.loads((extra["ddplab_runs_dir"] / "mixed" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["exit_codes"] == {"node0/rank0": 0, "node1/rank1": 0}
    print(f"\nmixed releases: make wheelhouse (3.11 + 3.13, CUDA_FALLBACK) {mixed['fill_s']:.0f} s, prepare "
          f"{t1 - t0:.0f} s, launch to the report {t2 - t1:.0f} s; byte_equivalent "
          f"{summary.get('byte_equivalent')}")
