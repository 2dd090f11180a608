"""The relay's plan, commands and choice (ddplab/relay.py, ddplab/distribution.py) and the lab key's
authorized_keys line (nodeprobe/relay_access.py), without hosts; tests/control/test_relay_simlan.py runs them
on simulated hosts."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from ddplab import distribution, relay, sync_push
from ddplab.errors import DdplabError
from nodeprobe import relay_access
from tests.helpers.playbooks import REPO


def nodes(n, have=()):
    """n nodes, each missing one file, except those named in ``have``."""
    return [{"name": f"n{i}", "root": "/lab", "addr": f"10.0.0.{i}", "conn": {"host": f"10.0.0.{i}"},
             "files": [] if f"n{i}" in have else [{"src": "/c/a.bin", "dest": "data/a.bin"}]}
            for i in range(n)]


@pytest.mark.parametrize(("count", "rounds"), [(2, 2), (3, 3), (4, 3), (8, 4)])
def test_rounds_double_the_holders(count, rounds):
    plan = relay.plan_rounds(nodes(count))
    assert len(plan) == rounds  # control -> seed, then log2(count) rounds
    assert plan[0] == [(relay.CONTROL, "n0")]
    received = [dst for r in plan for _, dst in r]
    assert sorted(received) == sorted(f"n{i}" for i in range(count))  # each node served exactly once
    assert sum(src == relay.CONTROL for r in plan for src, _ in r) == 1  # the uplink carries it once
    for i, r in enumerate(plan[1:], 1):
        holders = {dst for prev in plan[:i] for _, dst in prev}
        assert {src for src, _ in r} <= holders  # only nodes that hold the files send


def test_nodes_that_hold_everything_send_from_the_start():
    plan = relay.plan_rounds(nodes(4, have={"n0", "n2"}))
    assert plan == [[("n0", "n1"), ("n2", "n3")]]  # nothing leaves the control host


def test_dests_become_relative_to_the_lab_folder_and_outside_is_refused():
    node = {"name": "n", "root": "/lab/", "base": "/lab/data", "src_dir": "/c", "files": ["a.bin"]}
    assert relay.under_root(node)["files"] == [{"src": "/c/a.bin", "dest": "data/a.bin"}]
    assert relay.under_root({**node, "base": "/lab"})["files"][0]["dest"] == "a.bin"
    assert relay.under_root({**node, "base": "/labx/data"}) is None
    assert relay.under_root({**node, "base": "/srv/data"}) is None


def test_a_bare_name_needs_src_dir():
    assert sync_push.expand({"src_dir": "/c/", "files": ["x", {"src": "/s/y", "dest": "y"}]}) == [
        {"src": "/c/x", "dest": "x"}, {"src": "/s/y", "dest": "y"}]
    with pytest.raises(DdplabError, match="src_dir"):
        sync_push.expand({"files": ["x"]})


def test_hop_runs_rsync_on_the_holder_with_the_lab_key_and_checked_host_keys():
    src = {"name": "a", "root": "/home/me/lab", "addr": "10.0.0.1",
           "conn": {"host": "10.0.0.1", "user": "me", "port": 2222, "key": "/k", "common_args": "-o X=1"}}
    dst = {"name": "b", "root": "/home/you/lab", "addr": "10.0.0.2", "conn": {"host": "h2", "user": "you"}}
    argv = relay.hop_argv(src, dst)
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and "-o" in argv and "X=1" in argv
    assert argv[argv.index("--") - 1] == "10.0.0.1" and argv[argv.index("-l") + 1] == "me"
    remote = shlex.split(argv[-1])
    assert remote[0] == "rsync" and "--partial" in remote and "--files-from=-" in remote
    assert remote[-2:] == ["/home/me/lab/", "10.0.0.2:"]  # the receiver's rrsync roots "" at its lab folder
    rsh = shlex.split(remote[remote.index("--rsh") + 1])
    assert "StrictHostKeyChecking=yes" in rsh and "UserKnownHostsFile=/home/me/lab/.relay/known_hosts" in rsh
    assert rsh[rsh.index("-i") + 1] == "/home/me/lab/.relay/id_ed25519" and rsh[-2:] == ["-l", "you"]
    assert not any("StrictHostKeyChecking=no" in a for a in argv + rsh)


def test_choice_auto_star_relay_and_why():
    three = [{"name": f"n{i}", "root": "/lab"} for i in range(3)]
    assert distribution.decide("auto", three[:2])["mode"] == "star"
    assert distribution.decide("auto", three)["mode"] == "relay"
    assert distribution.decide("relay", three[:2])["mode"] == "relay"
    assert distribution.decide("star", three)["mode"] == "star"
    local = distribution.decide("relay", [{**three[0], "local": True}] + three[1:])
    assert local["mode"] == "star" and "n0" in local["why"] and "ansible_connection=local" in local["why"]
    no_rrsync = distribution.decide("auto", [{**n, "rrsync": "", "rsync": "/usr/bin/rsync",
                                              "host_keys": ["k"]} for n in three])
    assert no_rrsync["mode"] == "star" and "no rrsync" in no_rrsync["why"] and "(star)" in no_rrsync["why"]
    no_key = distribution.decide("auto", [{**n, "rrsync": "/r", "rsync": "/s", "host_keys": []}
                                          for n in three])
    assert no_key["mode"] == "star" and "host key" in no_key["why"]
    probed = [{**n, "rrsync": "/r", "rsync": "/s", "host_keys": [f"10.0.0.{i} ssh-ed25519 K"]}
              for i, n in enumerate(three)]
    ok = distribution.decide("auto", probed)
    assert ok["known_hosts"].splitlines() == [f"10.0.0.{i} ssh-ed25519 K" for i in range(3)]
    with pytest.raises(DdplabError, match="auto, star, relay"):
        distribution.decide("p2p", three)


def test_the_verb_answers_json():
    spec = {"setting": "auto", "nodes": [{"name": "a", "root": "/lab"}]}
    out = subprocess.run([sys.executable, "-m", "ddplab", "distribution"], input=json.dumps(spec), cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["mode"] == "star"
    bad = subprocess.run([sys.executable, "-m", "ddplab", "relay", "--progress", "/dev/null"], input="{}",
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("ddplab: error: relay:")
    assert "Traceback" not in bad.stderr


PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY ddplab-relay"


def test_entry_is_restricted_to_rrsync_write_only_in_the_lab_folder():
    line = relay_access.entry("/usr/bin/rrsync", "/home/me/ddplab", PUB, ["10.0.0.1", "10.0.0.2"])
    assert line == ('restrict,from="10.0.0.1,10.0.0.2",command="/usr/bin/rrsync -wo -no-del -munge '
                    '/home/me/ddplab" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY ddplab-relay:/home/me/ddplab')
    with pytest.raises(ValueError):
        relay_access.entry("/usr/bin/rrsync", '/home/me/x" y', PUB, [])


def test_only_the_marked_line_is_added_replaced_and_removed(tmp_path, monkeypatch):
    ak = tmp_path / "ssh" / "authorized_keys"
    ak.parent.mkdir()
    user = "ssh-rsa AAAAuser me@laptop\ncommand=\"x\" ssh-ed25519 AAAAother backup\n"
    ak.write_text(user)
    ak.chmod(0o640)
    monkeypatch.setattr(relay_access, "find_rrsync", lambda: "/usr/bin/rrsync")
    monkeypatch.setattr(relay_access.shutil, "which", lambda name: f"/usr/bin/{name}")
    spec = {"state": "present", "root": "/lab", "pubkey": PUB, "from": ["10.0.0.1"],
            "authorized_keys": str(ak)}
    assert relay_access.apply({**spec, "state": "probe"})["changed"] and ak.read_text() == user
    assert relay_access.apply(spec)["changed"]
    assert ak.read_text().startswith(user) and ak.read_text().count("ddplab-relay:/lab") == 1
    assert oct(ak.stat().st_mode & 0o777) == "0o640"  # the user's mode kept
    assert not relay_access.apply(spec)["changed"]  # idempotent
    other = {**spec, "root": "/lab2"}
    relay_access.apply(other)  # a second lab folder: its own line
    assert relay_access.apply({**spec, "pubkey": PUB.replace("KEY", "NEW")})["changed"]  # a new key replaces
    assert ak.read_text().count("ddplab-relay:/lab\n") == 1 and "NEW" in ak.read_text()
    assert relay_access.apply({**spec, "state": "absent"})["changed"]
    assert relay_access.apply({**other, "state": "absent"})["changed"]
    assert ak.read_text() == user
    assert not relay_access.apply({**spec, "state": "absent"})["changed"]


def test_no_rrsync_writes_no_line(tmp_path, monkeypatch):
    monkeypatch.setattr(relay_access, "find_rrsync", lambda: "")
    ak = tmp_path / "authorized_keys"
    out = relay_access.apply({"state": "present", "root": "/lab", "pubkey": PUB, "authorized_keys": str(ak)})
    assert out["rrsync"] == "" and not out["changed"] and not os.path.exists(ak)
