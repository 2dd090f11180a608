"""The README's simulated-host commands (tests/test_readme.py's SIMLAN list) run as typed, in a file of
their own so that `make test`'s workers run them beside the local ones (both take minutes)."""

from __future__ import annotations

import pytest

from tests.test_readme import LOCAL, REPO, SIMLAN, run


@pytest.mark.slow
@pytest.mark.simlan
def test_simlan_readme_commands_run_as_typed(skip_unless_simlan, simlan_cluster):
    simlan_cluster.discard()  # the README's own `up` makes the cluster; its `down` removes it
    assert (REPO / "data" / "shards" / "manifest.json").exists() or run(LOCAL[0], 300).returncode == 0
    try:
        for cmd in SIMLAN:
            proc = run(cmd, timeout=900)
            assert proc.returncode == 0, f"{cmd}\n{(proc.stdout + proc.stderr)[-3000:]}"
            if "status.yml -l node1" in cmd:
                assert "not asked (left out by --limit)" in proc.stdout and "unreachable=0" in proc.stdout
    finally:
        run("python -m simlan down", 120)
