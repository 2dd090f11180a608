"""Inventories for `ddplab.settings.validate` as the role sends them, and the lines it prints."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from pathlib import Path

import pytest

from ddplab.settings import validate as v

REPO = Path(__file__).resolve().parents[2]


def make_shards(out: Path) -> Path:
    """A small deterministic shard set (trainer.data prepare), made once per test session."""
    if not (out / "manifest.json").exists():
        subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(out), "--docs", "256"],
                       cwd=REPO, check=True, capture_output=True, timeout=120)
    return out


def inventory(shards: Path, nodes: int = 2, connection: str = "ssh", **run) -> dict:
    """A healthy inventory of `nodes` hosts on 10.9.0.x; `run` settings are given to every host."""
    names = [f"node{i}" for i in range(nodes)]
    hosts = {}
    for i, h in enumerate(names):
        given = {"ddplab_node_rank": i, "ddplab_data_dir": str(shards), **copy.deepcopy(run)}
        hosts[h] = {"vars": given, "ansible_host": f"10.9.0.{10 + i}", "ansible_connection": connection}
    return {"playbook_dir": str(REPO / "playbooks"),
            "groups": {"ddplab_nodes": names, "ddplab_master": names[:1], "ddplab_workers": names[1:]},
            "hosts": hosts}


def lines(inv: dict, network: bool = False) -> list[str]:
    """The lines `python -m ddplab validate` prints for this inventory (merged, errors first)."""
    out = io.StringIO()
    v.report(v.validate(inv, network=network), inv.get("groups", {}).get("ddplab_nodes") or [], stream=out)
    return out.getvalue().splitlines()


def errors(inv: dict, network: bool = False) -> list[str]:
    return [ln for ln in lines(inv, network) if ln.startswith("ddplab: error:")]


def one_error(inv: dict, subject: str, network: bool = False) -> str:
    """The single error line, asserting it names `subject` and has the four parts."""
    found = errors(inv, network)
    assert len(found) == 1, found
    line = found[0]
    assert line.startswith(f"ddplab: error: {subject} ("), line
    assert line.count("; ") >= 2, line  # found; allowed; fix
    return line


@pytest.fixture(scope="session")
def shards(tmp_path_factory):
    """Import this fixture into a test module: `from settings_helpers import shards`."""
    return make_shards(tmp_path_factory.getbasetemp() / "settings-shards")
