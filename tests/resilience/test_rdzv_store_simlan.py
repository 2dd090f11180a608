"""The elastic run's rendezvous store (ddplab rdzv-store) on the control host is reachable by the lab's
nodes only, and ends with the run: a real attempt from a host outside the inventory, real TCPStore
clients on the simulated hosts (torch unpickles what it reads from the store: an outsider who reaches it
could run code on every node)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers.playbooks import REPO

pytestmark = [pytest.mark.slow, pytest.mark.simlan]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _store(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "ddplab", "rdzv-store", *args], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def _listening(port: int) -> bool:
    return f":{port} " in subprocess.run(["ss", "-Htln"], capture_output=True, text=True, timeout=30).stdout


def test_only_the_labs_nodes_reach_the_store_and_it_ends_with_the_run(simlan2, tmp_path):
    c = simlan2
    node0 = c.host("node0").addr  # in the lab
    port = _free_port()
    info = _store("start", "--state", str(tmp_path), "--port", str(port), "--toward", node0, "--allow", node0,
                  "--idle-seconds", "30")
    host = info["host"]
    assert info["allow"] == sorted([node0, host])
    client = ("import datetime, torch.distributed as d; "
              f"s = d.TCPStore({host!r}, {port}, is_master=False, timeout=datetime.timedelta(seconds=10)); "
              "s.set('joined', 'yes'); print(s.get('joined').decode())")
    member = c.exec("node0", [sys.executable, "-c", client], timeout=90)
    assert member.returncode == 0 and member.stdout.strip() == "yes", member.stderr[-2000:]
    # node1 is not in this lab's inventory: its SYN is dropped by the kernel, it cannot even connect
    knock = (f"import socket; s = socket.socket(); s.settimeout(4); s.connect(({host!r}, {port})); "
             "print('connected')")
    assert _listening(port)  # the store is up: a refusal below could only come from the filter
    outsider = c.exec("node1", [sys.executable, "-c", knock], timeout=60)
    assert _listening(port), "the store ended before the outsider's knock was judged: raise --idle-seconds"
    assert outsider.returncode != 0 and "connected" not in outsider.stdout, outsider.stdout
    assert "timed out" in outsider.stderr, outsider.stderr[-500:]
    # no node connected any more (the run is over, nobody waits): the store ends by itself
    deadline = time.monotonic() + 90
    while _listening(port):
        assert time.monotonic() < deadline, f"the store still listens on {port} with no node connected"
        time.sleep(1)
    assert "the run is over; the store ends" in (tmp_path / "rdzv-store.log").read_text()
    assert _store("stop", "--state", str(tmp_path)) == {"stopped": None}
    # and stop.yml's path: a store that stop ends listens no more
    _store("start", "--state", str(tmp_path), "--port", str(port), "--toward", node0, "--allow", node0)
    assert _listening(port)
    assert _store("stop", "--state", str(tmp_path))["stopped"] is not None
    deadline = time.monotonic() + 30
    while _listening(port):
        assert time.monotonic() < deadline, "the store still listens after stop"
        time.sleep(0.5)
