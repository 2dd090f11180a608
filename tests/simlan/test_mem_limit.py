"""`simlan up --mem-limit node1=96M`: the host's memory cap is in force for every process on it (exec, an SSH
login) and the node's own probe reports it, as on a small laptop; a host without one is not capped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simlan import cpuquota, memlimit
from simlan.errors import SimlanError

pytestmark = pytest.mark.simlan

LIMIT_MB = 96
# writes every page (b"x" * n), so the memory is really taken, not only reserved
GRAB = "b = b'x' * ({mb} << 20); print('held', len(b) >> 20)"
REPO_PROBE = ("import sys; sys.path.insert(0, {repo!r}); "
              "from nodeprobe.fingerprint import cgroup_memory_limit; print(cgroup_memory_limit())")


@pytest.fixture(scope="module")
def capped(simlan_cluster):
    c = simlan_cluster(2, mem_limit=(f"node1={LIMIT_MB}M",))
    yield c
    simlan_cluster.discard()  # the next test file gets hosts without the cap


def grab(c, host, mb) -> subprocess.CompletedProcess:
    return c.exec(host, ["python3", "-c", GRAB.format(mb=mb)], timeout=60)


def test_a_process_over_the_hosts_memory_is_killed_and_one_under_it_runs(capped):
    node0, node1 = capped.host("node0"), capped.host("node1")
    assert node0.mem_cgroup is None and memlimit.limit(node1.mem_cgroup) == LIMIT_MB << 20
    assert node1.pid1 in cpuquota.members(node1.mem_cgroup)  # PID 1, so everything it starts
    over = grab(capped, "node1", 2 * LIMIT_MB)
    assert over.returncode in (-9, 137) and "held" not in over.stdout, (over.returncode, over.stdout)
    assert grab(capped, "node1", LIMIT_MB // 3).stdout.split() == ["held", str(LIMIT_MB // 3)]
    assert grab(capped, "node0", 2 * LIMIT_MB).returncode == 0  # no cap on node0


def test_an_ssh_login_is_capped_and_the_nodes_probe_reports_the_cap(capped):
    login = subprocess.run(capped.ssh_argv("node1", "python3", "-c", f'"{GRAB.format(mb=2 * LIMIT_MB)}"'),
                           capture_output=True, text=True, timeout=60)
    assert login.returncode != 0 and "held" not in login.stdout
    repo = str(memlimit.__file__).rsplit("/simlan/", 1)[0]
    seen = capped.exec("node1", [sys.executable, "-c", REPO_PROBE.format(repo=repo)], check=True)
    assert int(seen.stdout) == LIMIT_MB << 20  # preflight's memory cell compares against this
    assert capped.exec("node0", [sys.executable, "-c", REPO_PROBE.format(repo=repo)],
                       check=True).stdout.strip() == "None"


def test_bad_limits_are_one_line_errors():
    with pytest.raises(SimlanError, match="not HOST=SIZE"):
        memlimit.parse(["node1"], ["node0", "node1"])
    with pytest.raises(SimlanError, match="no host 'node7'"):
        memlimit.parse(["node7=1G"], ["node0", "node1"])
    with pytest.raises(SimlanError, match="below 32M"):
        memlimit.parse(["node1=1M"], ["node0", "node1"])
    assert memlimit.parse(["node1=1536M", "node0=2G"], ["node0", "node1"]) == {"node1": 1536 << 20,
                                                                               "node0": 2 << 30}
