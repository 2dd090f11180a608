"""The relay's plan, commands and choice (ddplab/relay.py, ddplab/distribution.py), each peer's
authorized_keys line (nodeprobe/relay_access.py), the receiver's one accepted command
(nodeprobe/relay_receive.py) and the receiver's own step (nodeprobe/relay_take.py), without hosts;
tests/orchestrator/test_relay_simlan.py runs them on simulated hosts."""

import hashlib
import ipaddress
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ddplab import distribution, relay, sync_push
from ddplab.errors import DdplabError
from ddplab.node_command import nodeprobe_command
from nodeprobe import relay_access, relay_receive, relay_take
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


def test_hop_runs_rsync_on_the_holder_with_its_own_key_and_checked_host_keys():
    src = {"name": "a", "root": "/home/me/lab", "addr": "10.0.0.1",
           "conn": {"host": "10.0.0.1", "user": "me", "port": 2222, "key": "/k", "common_args": "-o X=1"}}
    dst = {"name": "b", "root": "/home/you/lab", "addr": "10.0.0.2", "conn": {"host": "h2", "user": "you"}}
    argv = relay.hop_argv(src, dst)
    assert argv[:3] == ["ssh", "-o", "BatchMode=yes"] and "-o" in argv and "X=1" in argv
    assert argv[argv.index("--") - 1] == "10.0.0.1" and argv[argv.index("-l") + 1] == "me"
    remote = shlex.split(argv[-1])
    assert remote[0] == "rsync" and "--partial" in remote and "--include-from=-" in remote
    assert not any(a.startswith("--files-from") for a in remote)  # it adds -R, which the receiver refuses
    assert remote[-2:] == ["/home/me/lab/", "10.0.0.2:"]  # the receiver's forced command writes to staging
    rsh = shlex.split(remote[remote.index("--rsh") + 1])
    assert "StrictHostKeyChecking=yes" in rsh and "UserKnownHostsFile=/home/me/lab/.relay/known_hosts" in rsh
    assert rsh[rsh.index("-i") + 1] == "/home/me/lab/.relay/id_ed25519" and rsh[-2:] == ["-l", "you"]
    assert not any("StrictHostKeyChecking=no" in a for a in argv + rsh)


def test_hop_rules_name_each_file_and_its_folders_only(tmp_path):
    dests = ["data/a.bin", "code/x/we*ird[1].py", "top"]
    rules = relay.hop_rules(dests).decode().split("\0")[:-1]
    assert rules == sorted(["/data/", "/data/a.bin", "/code/", "/code/x/", "/code/x/we\\*ird\\[1].py",
                            "/top"])
    # rsync picks exactly those files with them
    src = tmp_path / "src"
    for rel in [*dests, "data/b.bin", "code/x/weXird1.py", "other/top"]:
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(rel)
    out = tmp_path / "out"
    subprocess.run(["rsync", "--recursive", "--from0", "--include-from=-", "--exclude=*", f"{src}/",
                    f"{out}/"], input=relay.hop_rules(dests), check=True)
    got = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert got == sorted(dests)


def test_the_receiver_accepts_only_the_hops_own_command():
    ok = "rsync --server -trIe.LsfxCIvu --partial . ."
    assert relay_receive.accepted(ok) == ok.split(" ")
    assert relay_receive.accepted("rsync --server -trIe.iLsfxCIvu --partial . .")  # another rsync's letters
    for bad in ("rsync --server -trIe.LsfxCIvu --partial --force . .",
                "rsync --server -re.iLsfxCIvu --force . .",
                "rsync --server --sender -Re.LsfxCIvu --files-from runs/x . .",
                "rsync --server -rpe.LsfxCIvu . .", "rsync --server -trIRe.LsfxCIvu --partial . .",
                "rsync --server -trIe.LsfxCIvu --partial . /root/.ssh",
                "rsync --server -trIe.LsfxCIvu --partial . ..",
                "rsync --server -trIe.LsfxCIvu --partial . .; id", "id", "",
                "rsync --server -trIe.LsfxCIvu --partial . .\nid"):
        assert relay_receive.accepted(bad) is None, bad


def test_the_receiver_refuses_with_one_line_and_runs_nothing(tmp_path):
    program = tmp_path / ".relay" / "receive.py"
    program.parent.mkdir()
    program.write_text((Path(relay_receive.__file__)).read_text())
    env = {"SSH_ORIGINAL_COMMAND": "rsync --server -rpe.LsfxCIvu . .", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-I", str(program)], capture_output=True, text=True, env=env)
    assert proc.returncode == 1 and proc.stderr.startswith("ddplab relay: refused 'rsync --server -rpe.")
    assert len(proc.stderr.splitlines()) == 1 and "Traceback" not in proc.stderr


def test_take_runs_the_one_way_and_reads_its_spec_after_its_program(tmp_path):
    """The node's step is the argv node_command gives for `nodeprobe relay-take` (roles/code_sync passes it
    from the ddplab_node_argv lookup): its program first on stdin, the spec after it."""
    (tmp_path / ".relay" / "incoming").mkdir(parents=True)
    (tmp_path / ".relay" / "incoming" / "a").write_text("x")
    take, _ = nodeprobe_command("relay-take", [], sys.executable)
    argv = relay.take_argv({"conn": {"host": "n1"}, "take": take})
    boot = argv[argv.index("--") + 1:]
    spec = {"root": str(tmp_path), "files": [{"dest": "a", "sha256": hashlib.sha256(b"x").hexdigest()}]}
    proc = subprocess.run(shlex.split(boot[0]), input=relay.take_source() + json.dumps(spec),
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {"placed": ["a"], "refused": []}, proc.stderr


def take(root, files, keep=()):
    return relay_take.take({"root": str(root), "files": files, "keep": list(keep)})


def test_take_places_only_what_matches_and_empties_staging(tmp_path):
    staging = tmp_path / ".relay" / "incoming"
    (staging / "data").mkdir(parents=True)
    (staging / "data" / "a.bin").write_bytes(b"good")
    (staging / "data" / "b.bin").write_bytes(b"evil")
    (staging / "data" / "later.bin").write_bytes(b"part")
    (staging / "venv" / "site").mkdir(parents=True)
    (staging / "venv" / "site" / "zz.pth").write_text("import os")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "b.bin").write_bytes(b"old")
    out = take(tmp_path, [{"dest": "data/a.bin", "sha256": hashlib.sha256(b"good").hexdigest()},
                          {"dest": "data/b.bin", "sha256": hashlib.sha256(b"new").hexdigest()},
                          {"dest": "data/c.bin", "sha256": "0" * 64},
                          {"dest": "../x", "sha256": "0" * 64}, {"dest": ".relay/receive.py", "sha256": "0"}],
               keep=["data/later.bin"])
    assert out["placed"] == ["data/a.bin"]
    assert [r["dest"] for r in out["refused"]] == ["data/b.bin", "data/c.bin", "../x", ".relay/receive.py"]
    assert "sha256" in out["refused"][0]["why"] and "did not arrive" in out["refused"][1]["why"]
    assert (tmp_path / "data" / "a.bin").read_bytes() == b"good"
    assert oct((tmp_path / "data" / "a.bin").stat().st_mode & 0o777) == "0o644"
    assert (tmp_path / "data" / "b.bin").read_bytes() == b"old"  # the placed file stays as it was
    assert sorted(str(p.relative_to(staging)) for p in staging.rglob("*")) == ["data", "data/later.bin"]
    assert not (tmp_path / "venv").exists() and not (tmp_path / ".relay" / "taking").exists()


def test_take_replaces_a_link_at_dest_and_refuses_a_staged_link_or_folder(tmp_path):
    staging = tmp_path / ".relay" / "incoming"
    staging.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (staging / "a").write_text("new")
    (tmp_path / "a").symlink_to(outside)  # dest is a link: replaced, never written through
    (staging / "b").symlink_to(outside)
    (staging / "c").mkdir()
    want = hashlib.sha256(b"new").hexdigest()
    out = take(tmp_path, [{"dest": d, "sha256": want} for d in ("a", "b", "c")])
    assert out["placed"] == ["a"] and [r["dest"] for r in out["refused"]] == ["b", "c"]
    assert outside.read_text() == "keep" and not (tmp_path / "a").is_symlink()
    assert list(staging.iterdir()) == []


def test_choice_auto_star_relay_and_why():
    three = [{"name": f"n{i}", "root": "/lab"} for i in range(3)]
    assert distribution.decide("auto", three[:2])["mode"] == "star"
    assert distribution.decide("auto", three)["mode"] == "relay"
    assert distribution.decide("relay", three[:2])["mode"] == "relay"
    assert distribution.decide("star", three)["mode"] == "star"
    local = distribution.decide("relay", [{**three[0], "local": True}] + three[1:])
    assert local["mode"] == "star" and "n0" in local["why"] and "ansible_connection=local" in local["why"]
    no_rsync = distribution.decide("auto", [{**n, "rsync": "", "host_keys": ["k"]} for n in three])
    assert no_rsync["mode"] == "star" and "no rsync" in no_rsync["why"] and "(star)" in no_rsync["why"]
    no_key = distribution.decide("auto", [{**n, "rsync": "/s", "host_keys": []} for n in three])
    assert no_key["mode"] == "star" and "host key" in no_key["why"]
    probed = [{**n, "addr": f"10.0.0.{i}", "pubkey": f"ssh-ed25519 K{i}", "rsync": "/s",
               "host_keys": [f"10.0.0.{i} ssh-ed25519 K"]} for i, n in enumerate(three)]
    ok = distribution.decide("auto", probed)
    assert ok["known_hosts"].splitlines() == [f"10.0.0.{i} ssh-ed25519 K" for i in range(3)]
    assert ok["peers"] == [{"name": f"n{i}", "from": [f"10.0.0.{i}"], "pubkey": f"ssh-ed25519 K{i}"}
                           for i in range(3)]
    with pytest.raises(DdplabError, match="auto, star, relay"):
        distribution.decide("p2p", three)


def test_a_node_vouches_for_its_own_host_key_only():
    node = {"name": "n1", "addr": "10.0.0.1", "host_keys": [
        "10.0.0.1 ssh-ed25519 OWN", "[10.0.0.1]:2222 ssh-ed25519 PORT", "10.0.0.2 ssh-ed25519 PEERS",
        "* ssh-ed25519 ANY", "@cert-authority 10.0.0.1 ssh-ed25519 CA", "10.0.0.10 ssh-ed25519 PREFIX"]}
    own = ["10.0.0.1 ssh-ed25519 OWN", "[10.0.0.1]:2222 ssh-ed25519 PORT"]
    assert distribution.own_host_keys(node) == own
    rogue = [{"name": f"n{i}", "root": "/lab", "addr": f"10.0.0.{i}", "rsync": "/s",
              "host_keys": [f"10.0.0.{i} ssh-ed25519 K{i}", f"10.0.0.{(i + 1) % 3} ssh-ed25519 FAKE"]}
             for i in range(3)]  # each also claims the next node's address
    assert "FAKE" not in distribution.decide("auto", rogue)["known_hosts"]


def test_the_verb_answers_json():
    spec = {"setting": "auto", "nodes": [{"name": "a", "root": "/lab"}]}
    out = subprocess.run([sys.executable, "-m", "ddplab", "distribution"], input=json.dumps(spec), cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["mode"] == "star"
    bad = subprocess.run([sys.executable, "-m", "ddplab", "relay", "--progress", "/dev/null"], input="{}",
                         cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("ddplab: error: relay:")
    assert "Traceback" not in bad.stderr


PUB = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY ddplab-relay:/lab"


def test_entry_lets_one_peer_run_the_receiver_from_its_address_only():
    line = relay_access.entry("/usr/bin/python3", "/home/me/ddplab", "node1", PUB, ["10.0.0.1"])
    assert line == ('restrict,from="10.0.0.1",command="/usr/bin/python3 -I /home/me/ddplab/.relay/'
                    'receive.py" ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKEY ddplab-relay:/home/me/ddplab node1')
    for bad in (("/usr/bin/python3", '/home/me/x" y', "node1", PUB, ["10.0.0.1"]),
                ("/usr/bin/python3", "/lab", "node 1", PUB, ["10.0.0.1"]),
                ("/usr/bin/python3", "/lab", "node1", PUB, ["laptop.local"]),  # addresses only
                ("/usr/bin/python3", "/lab", "node1", PUB, [])):
        with pytest.raises(ValueError):
            relay_access.entry(*bad)


def test_a_host_name_is_resolved_on_the_control_host_or_refused():
    assert distribution.addresses("n", "10.0.0.7") == ["10.0.0.7"]
    assert distribution.addresses("n", "localhost") and all(
        ipaddress.ip_address(a).is_loopback for a in distribution.addresses("n", "localhost"))
    with pytest.raises(DdplabError, match="n: its lab address 'no-such-host.invalid' is not an IP address"):
        distribution.addresses("n", "no-such-host.invalid")


def test_lines_follow_the_inventory_and_only_ours_change(tmp_path, monkeypatch):
    ak = tmp_path / "ssh" / "authorized_keys"
    ak.parent.mkdir()
    root = tmp_path / "lab"
    old = (f'restrict,command="/usr/bin/rrsync -wo -no-del -munge {root}" ssh-ed25519 AAAAold '
           f"ddplab-relay:{root}\n")
    user = "ssh-rsa AAAAuser me@laptop\ncommand=\"x\" ssh-ed25519 AAAAother backup\n"
    ak.write_text(user + old)
    ak.chmod(0o640)
    spec = {"root": str(root), "authorized_keys": str(ak), "known_hosts": "h\n", "receiver": "# r\n"}
    peers = [{"name": n, "from": [f"10.0.0.{i}"], "pubkey": PUB.replace("KEY", n)} for i, n in
             enumerate(["n0", "n1", "n2"])]
    inventory = ["n0", "n1", "n2"]
    run = relay_access.STATES["present"]
    assert run({**spec, "state": "present", "name": "n0", "inventory": inventory, "peers": peers,
                "check": True})["changed"]
    assert ak.read_text() == user + old and not root.exists()  # check mode writes nothing
    assert run({**spec, "state": "present", "name": "n0", "inventory": inventory, "peers": peers})["changed"]
    text = ak.read_text()
    assert text.startswith(user) and "rrsync" not in text  # the old lab key's line is gone
    assert [ln.split()[-1] for ln in text.splitlines()[2:]] == ["n1", "n2"]  # not itself
    assert oct(ak.stat().st_mode & 0o777) == "0o640"  # the user's mode kept
    assert oct((root / ".relay").stat().st_mode & 0o777) == "0o700"
    assert (root / ".relay" / "receive.py").read_text() == "# r\n"
    assert (root / ".relay" / "incoming").is_dir()
    mine = {**spec, "state": "present", "name": "n0"}
    assert not run({**mine, "inventory": inventory, "peers": peers})["changed"]
    # a second lab folder of the same user keeps its own lines
    other = {**spec, "root": str(tmp_path / "lab2"), "state": "present", "name": "n0", "inventory": inventory,
             "peers": peers}
    assert run(other)["changed"] and ak.read_text().count("ddplab-relay:") == 4
    # --limit n0,n1: n2's line stays (its key was not read); n2 leaves the inventory: its line goes
    assert not run({**mine, "inventory": inventory, "peers": peers[:2]})["changed"]
    assert run({**mine, "inventory": inventory[:2], "peers": peers[:2]})["changed"]
    text = ak.read_text()
    assert f"ddplab-relay:{root} n2" not in text and f"ddplab-relay:{tmp_path}/lab2 n2" in text
    # star: none of this lab folder's lines; staging emptied
    (root / ".relay" / "incoming" / "junk").write_text("x")
    assert relay_access.STATES["absent"]({**spec, "state": "absent"})["changed"]
    assert f"ddplab-relay:{root} " not in ak.read_text() and ak.read_text().count("ddplab-relay:") == 2
    assert list((root / ".relay" / "incoming").iterdir()) == []
    assert not relay_access.STATES["absent"]({**spec, "state": "absent"})["changed"]
    # forget: the rest of what the relay placed; a file of the user's in .relay stays, with the folder
    (root / ".relay" / "notes.txt").write_text("mine")
    assert relay_access.STATES["forget"]({**spec, "state": "forget"})["changed"]
    assert sorted(p.name for p in (root / ".relay").iterdir()) == ["notes.txt"]
    assert relay_access.STATES["forget"]({**other, "state": "forget"})["changed"]
    assert ak.read_text() == user and not (tmp_path / "lab2" / ".relay").exists()


def test_a_symlinked_authorized_keys_keeps_its_link(tmp_path):
    managed = tmp_path / "managed_keys"
    managed.write_text("ssh-rsa AAAAuser me@laptop\n")
    ak = tmp_path / "authorized_keys"
    ak.symlink_to(managed)
    spec = {"state": "present", "root": str(tmp_path / "lab"), "name": "n0", "inventory": ["n0", "n1"],
            "peers": [{"name": "n1", "from": ["10.0.0.1"], "pubkey": PUB}], "known_hosts": "", "receiver": "",
            "authorized_keys": str(ak)}
    assert relay_access.STATES["present"](spec)["changed"]
    assert ak.is_symlink() and "ddplab-relay:" in managed.read_text()
    assert relay_access.STATES["absent"]({**spec, "state": "absent"})["changed"]
    assert ak.is_symlink() and managed.read_text() == "ssh-rsa AAAAuser me@laptop\n"


def test_keys_makes_one_key_pair_and_replaces_the_old_lab_key(tmp_path):
    relay_dir = tmp_path / ".relay"
    relay_dir.mkdir()
    (relay_dir / "id_ed25519").write_text("the old lab key, the same on every node\n")  # no .pub beside it
    spec = {"state": "keys", "root": str(tmp_path), "addr": "127.0.0.1", "port": 1}
    first = relay_access.STATES["keys"](spec)
    assert first["changed"] and first["pubkey"].startswith("ssh-ed25519 ")
    assert "old lab key" not in (relay_dir / "id_ed25519").read_text()
    assert oct((relay_dir / "id_ed25519").stat().st_mode & 0o777) == "0o600"
    again = relay_access.STATES["keys"](spec)
    assert not again["changed"] and again["pubkey"] == first["pubkey"]


def test_relay_access_reads_its_spec_after_its_program_on_stdin(tmp_path):
    """As ddplab_node runs it: the program, then its spec, on stdin (nothing of the spec on argv, where any
    process of the node sees it and a long receiver or known_hosts would pass the kernel's argument limit);
    a bad spec is one line, no traceback."""
    argv, program = nodeprobe_command("relay-access", [], sys.executable)
    ak = tmp_path / "authorized_keys"
    ak.write_text(f"ssh-ed25519 AAAAx ddplab-relay:{tmp_path}/lab n1\n")
    spec = {"state": "absent", "root": str(tmp_path / "lab"), "authorized_keys": str(ak)}
    proc = subprocess.run(argv, input=program + json.dumps(spec), capture_output=True, text=True, timeout=60)
    assert (proc.returncode, json.loads(proc.stdout)) == (0, {"changed": True}), proc.stderr
    assert ak.read_text() == ""
    bad = subprocess.run(argv, input=program + "{", capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("ddplab: error: relay access on this node: ")
    assert "Traceback" not in bad.stderr and len(bad.stderr.splitlines()) == 1
