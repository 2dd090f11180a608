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


def spec(name, files, tmp):
    return {"name": name, "root": "/lab", "addr": "a", "conn": {"host": "a"}, "files": [
        {"src": str(tmp / f), "dest": f} for f in files]}


def test_batches_cut_the_files_in_name_order(tmp_path, monkeypatch):
    monkeypatch.setattr(relay, "BATCH_MIN_BYTES", 10)
    for name, size in (("a", 6), ("b", 6), ("c", 30), ("d", 1)):
        (tmp_path / name).write_bytes(b"x" * size)
    nodes = [spec("n0", ["a", "c"], tmp_path), spec("n1", ["b", "d"], tmp_path)]
    assert relay.batches(nodes) == [["a", "b"], ["c"], ["d"]]  # at least 10 bytes each, the rest last


def test_a_batch_comes_from_an_idle_holder_and_the_uplink_serves_only_the_seed(tmp_path):
    (tmp_path / "a").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"y")
    cuts = [["a"], ["b"]]
    nodes = {n: relay.Node(spec(n, files, tmp_path), cuts)
             for n, files in (("n0", ["a", "b"]), ("n1", ["a", "b"]), ("n2", ["b"]), ("n3", []))}
    assert nodes["n2"].has == {0} and nodes["n3"].has == {0, 1}  # what a node does not need, it holds
    assert relay.pick(nodes["n1"], nodes, "n0", set()) == "n2"  # n2 holds batch 0 (it needs only b)
    assert relay.pick(nodes["n1"], nodes, "n0", {"n2", "n3"}) is None  # no idle holder: wait
    assert relay.pick(nodes["n0"], nodes, "n0", {"n2", "n3"}) == relay.CONTROL  # the seed: from the uplink
    assert relay.pick(nodes["n0"], nodes, "n0", {"n2", "n3", relay.CONTROL}) is None  # one upload at a time
    nodes["n0"].has.add(0)
    assert nodes["n0"].missing() == 1 and relay.pick(nodes["n2"], nodes, "n0", {"n3"}) is None  # b: not yet
    nodes["n0"].has.add(1)
    assert relay.pick(nodes["n2"], nodes, "n0", {"n3"}) == "n0"  # while n0 may still receive, it sends


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


def test_a_symlinked_authorized_keys_keeps_its_link(tmp_path, monkeypatch):
    managed = tmp_path / "managed_keys"
    managed.write_text("ssh-rsa AAAAuser me@laptop\n")
    ak = tmp_path / "authorized_keys"
    ak.symlink_to(managed)
    monkeypatch.setattr(relay_access, "find_rrsync", lambda: "/usr/bin/rrsync")
    monkeypatch.setattr(relay_access.shutil, "which", lambda name: f"/usr/bin/{name}")
    spec = {"state": "present", "root": "/lab", "pubkey": PUB, "authorized_keys": str(ak)}
    assert relay_access.apply(spec)["changed"]
    assert ak.is_symlink() and "ddplab-relay:/lab" in managed.read_text()
    assert relay_access.apply({**spec, "state": "absent"})["changed"]
    assert ak.is_symlink() and managed.read_text() == "ssh-rsa AAAAuser me@laptop\n"


def test_no_rrsync_writes_no_line(tmp_path, monkeypatch):
    monkeypatch.setattr(relay_access, "find_rrsync", lambda: "")
    ak = tmp_path / "authorized_keys"
    out = relay_access.apply({"state": "present", "root": "/lab", "pubkey": PUB, "authorized_keys": str(ak)})
    assert out["rrsync"] == "" and not out["changed"] and not os.path.exists(ak)
