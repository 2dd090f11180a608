"""The relay on simulated hosts (ddplab_distribution, roles/relay_ssh, ddplab/relay.py): a lab of 3 nodes
(node0-node2 of a 4-host cluster; node3 is a host outside the lab, on the same LAN).

One prepare serves the module: auto takes relay at 3 nodes; the code and the shards leave the control host
once (node0) and the other nodes get them from a node; every node's shards match the manifest's sha256;
a relay interrupted halfway (the receiver ended, the control host's job killed) resumes from what arrived
(--partial) and ends with every copy proven; the lab key
cannot run a command, read, or write outside the lab folder, from inside the lab or from node3; a
lab folder the forced command cannot hold falls back to star, saying why; `--check --diff` afterwards
changes nothing and shows no key.
"""

import hashlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from ddplab import relay
from ddplab.node_command import nodeprobe_command
from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

LAB = ("node0", "node1", "node2")
OUTSIDE = "node3"
ROOT = "/root/ddplab"  # ddplab_root (~/ddplab) of a root simlan host
KEY = f"{ROOT}/{relay.KEY_FILE}"  # each node's own relay key
STAGED = f"{ROOT}/.relay/incoming/big"  # where node1 receives big.bin before its own step checks it
BIG_MB = 48
TAKE = nodeprobe_command("relay-take", [], "python3")[0]  # as the ddplab_node_argv lookup gives it


def lab_inventory(cluster, folder: Path, drop=(OUTSIDE,)) -> Path:
    """The simlan inventory without node3 (without the ``drop`` nodes)."""
    inv = folder / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    src = Path(cluster.inventory_dir)
    hosts = yaml.safe_load((src / "hosts.yml").read_text())
    workers = hosts["all"]["children"]["ddplab_nodes"]["children"]["ddplab_workers"]["hosts"]
    for name in drop:
        del workers[name]
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    for f in (src / "group_vars" / "all").iterdir():
        (inv / "group_vars" / "all" / f.name).write_text(f.read_text())
    return inv


@pytest.fixture(scope="module")
def lab(simlan_cluster, tmp_path_factory):
    cluster = simlan_cluster(4, fresh=True)
    tmp = tmp_path_factory.mktemp("relay")
    shards = make_shards(tmp_path_factory.mktemp("shards"))
    inv = lab_inventory(cluster, tmp)
    extra = {"ddplab_data_dir": shards, "ddplab_runs_dir": tmp / "runs"}
    first = playbook("prepare.yml", inventory=inv, extra=extra, timeout=600)
    assert first.returncode == 0, tail(first)
    yield {"cluster": cluster, "inv": inv, "extra": extra, "shards": shards, "first": first, "tmp": tmp}
    simlan_cluster.discard()


def test_relay_sends_once_and_every_copy_matches(lab):
    out, cluster = lab["first"].stdout, lab["cluster"]
    assert "relay: each changed file leaves the control host once, to node0; the 3 nodes pass it on" in out
    # every node's line; only node0 gets its files from the control host
    for label in ("code: ", "shards: "):
        shown = [ln.removeprefix(label) for ln in out.splitlines() if ln.startswith(label)]
        lines = shown[-3:]  # the final lines, one per node, after those shown while it ran
        assert lines[0].startswith("node0 <- control: sent"), shown
        assert all(ln.split(" <- ")[1].startswith("node") and ": sent" in ln for ln in lines[1:]), shown
    manifest = json.loads((lab["shards"] / "manifest.json").read_text())
    want = {s["file"]: s["sha256"] for s in manifest["files"]}
    for host in LAB:
        sums = cluster.exec(host, ["sh", "-c", f"cd {ROOT}/data && sha256sum {' '.join(sorted(want))}"],
                            check=True).stdout
        assert dict(reversed(ln.split()) for ln in sums.splitlines()) == want, host
        mode = cluster.exec(host, ["stat", "-c", "%a", KEY], check=True).stdout.strip()
        assert mode == "600"


def test_check_diff_changes_nothing_and_shows_no_key(lab):
    proc = playbook("prepare.yml", "--check", "--diff", inventory=lab["inv"], extra=lab["extra"], timeout=600)
    assert proc.returncode == 0, tail(proc)
    assert all(r["changed"] == 0 for r in recap(proc).values()), changed_tasks(proc)
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr
    for host in LAB:
        private = lab["cluster"].exec(host, ["cat", KEY], check=True).stdout.splitlines()[1]
        assert private not in proc.stdout + proc.stderr


def changed_tasks(proc) -> list[str]:
    """Each task that changed a host, with what it printed."""
    blocks = proc.stdout.split("\nTASK [")
    return [block[:1500] for block in blocks if "\nchanged: [" in block]


def big_spec(lab, folder: Path) -> dict:
    inv = yaml.safe_load((lab["inv"] / "group_vars" / "all" / "simlan.yml").read_text())
    nodes = []
    for name in LAB:
        addr = lab["cluster"].host(name).addr
        conn = {"local": False, "host": addr, "user": "root", "port": None,
                "key": inv["ansible_ssh_private_key_file"], "ssh_args": "",
                "common_args": inv["ansible_ssh_common_args"], "extra_args": ""}
        nodes.append({"name": name, "root": ROOT, "addr": addr, "conn": conn, "take": TAKE,
                      "base": f"{ROOT}/big", "src_dir": str(folder), "files": ["big.bin"]})
    return {"nodes": nodes}


def tx_bytes() -> int:
    lab = os.environ.get("SIMLAN_LAB", "0") or 0
    return int(Path(f"/sys/class/net/lab{lab}/statistics/tx_bytes").read_text())


def test_an_interrupted_relay_resumes_and_proves_every_copy(lab, tmp_path):
    cluster = lab["cluster"]
    (tmp_path / "big.bin").write_bytes(os.urandom(BIG_MB << 20))
    want = hashlib.sha256((tmp_path / "big.bin").read_bytes()).hexdigest()
    spec, progress = json.dumps(big_spec(lab, tmp_path)), str(tmp_path / "relay.json")
    # Slow node0's link so the kill lands mid-transfer (the control host -> node0 leg is not shaped here,
    # node0 -> node1 is). The kill comes ~0.1-3 s after node1's copy is seen (a loaded CI machine): at
    # 100mbit the rest of the file took ~3.8 s, at 25mbit ~15 s; the kill comes as early in the file.
    cluster.exec("node0", ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "25mbit", "burst",
                           "256kb", "latency", "50ms"], check=True)
    argv = [sys.executable, "-m", "ddplab", "relay", "--progress", progress]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, text=True, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.stdin.write(spec)
    proc.stdin.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until node1's temporary copy (staging folder) holds some of it
        tmp = cluster.exec("node1", ["sh", "-c", f"find {STAGED} -name '.big.bin.*' -size +1M"]).stdout
        if tmp.strip():
            break
        time.sleep(0.1)
    # The interruption: node1's receiving rsync (the one process writing that temporary file) is ended as a
    # lost link or reboot would, and so is the control host's job (a playbook stopped with Ctrl-C).
    killed = cluster.exec("node1", ["sh", "-c", f"fuser -k -TERM {STAGED}/.big.bin.*"], timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    cluster.exec("node0", ["tc", "qdisc", "del", "dev", "eth0", "root"], check=True)
    assert killed.returncode == 0, "node1 had the whole file before the kill: make node0's link slower"

    def size(host, where):
        stat = f"stat -c %s {where}/big.bin 2>/dev/null || echo 0"
        return int(cluster.exec(host, ["sh", "-c", stat]).stdout)

    deadline = time.monotonic() + 30  # the TERMed rsync keeps what it got (--partial) as it exits
    while not size("node1", STAGED) and time.monotonic() < deadline:
        time.sleep(0.2)
    sizes = {h: size(h, where) for h, where in (("node0", f"{ROOT}/big"), ("node1", STAGED))}
    assert sizes["node0"] == BIG_MB << 20 and 0 < sizes["node1"] < BIG_MB << 20, sizes  # --partial
    assert cluster.exec("node1", ["ls", f"{ROOT}/big/big.bin"]).returncode != 0  # not in place unchecked
    before = tx_bytes()
    again = subprocess.run(argv, cwd=REPO, input=spec, text=True, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert tx_bytes() - before < (BIG_MB << 20) / 2  # node0 had it all: nothing resent from the control host
    assert json.loads(again.stdout)["fallbacks"] == []
    for host in LAB:
        assert cluster.exec(host, ["sha256sum", f"{ROOT}/big/big.bin"], check=True).stdout.split()[0] == want


# A rogue node1 uses its own relay key (the one ddplab made for it) against node2. Each attack is a shell
# command on node1 (RSH: ssh with that key, as the relay's own hop), what it did on the old rrsync line in
# brackets; each must fail and leave node2's lab folder, its modes and what is outside it as they were.
SECRET = f"{ROOT}/runs/x/trainer.env"
ATTACKS = {
    # [a recursive delete: runs/ replaced by a file]
    "delete (--force)": "mkdir -p /tmp/f && echo x > /tmp/f/runs && "
                        "rsync -r --force -e \"$RSH\" /tmp/f/ $PEER:",
    "delete (--delete)": "mkdir -p /tmp/e/runs && rsync -r --delete -e \"$RSH\" /tmp/e/ $PEER:",
    # [printed the secrets back]
    "read (--files-from=:)": "rsync -e \"$RSH\" --files-from=:runs/x/trainer.env /tmp/ $PEER:",
    "read (--files-from=:, pull)": "rsync -e \"$RSH\" --files-from=:runs/x/trainer.env $PEER: /tmp/stolen/",
    "read (sender)": "rsync -r -e \"$RSH\" $PEER:runs/ /tmp/stolen/",
    # [the lab folder, .relay and the key 777]
    "chmod (-p)": "mkdir -p /tmp/p && chmod 777 /tmp/p && rsync -rp -e \"$RSH\" /tmp/p/ $PEER:",
    "chmod (--chmod)": "mkdir -p /tmp/c && rsync -r --chmod=a+rwx -e \"$RSH\" /tmp/c/ $PEER:",
    # [wrote through node2's own link lab/escape -> /root/outside]
    "symlink escape (-R --no-implied-dirs)":
        "mkdir -p /tmp/r/escape && echo x > /tmp/r/escape/pwned && cd /tmp/r && "
        "rsync -R --no-implied-dirs -e \"$RSH\" escape/pwned $PEER:",
    "symlink (-l)": "mkdir -p /tmp/l && ln -sfn /root/.ssh /tmp/l/code && "
                    "rsync -rl -e \"$RSH\" /tmp/l/ $PEER:",
    # [a .pth in the venv runs as the user at the next launch]
    "venv .pth plant": "mkdir -p /tmp/v/$SITE && echo 'import os' > /tmp/v/$SITE/zz.pth && "
                       "rsync -r -e \"$RSH\" /tmp/v/ $PEER:",
    "write outside (absolute)": "echo x > /tmp/x && rsync -e \"$RSH\" /tmp/x $PEER:/root/.ssh/pwned",
    "write outside (..)": "echo x > /tmp/x && rsync -e \"$RSH\" /tmp/x $PEER:../pwned",
    "shell": "$RSH $PEER 'touch /root/pwned; id'",
}
# The hop's own options are accepted: a .pth sent with them lands in the staging folder, not in the venv.
SITE = "venv/lib/python3.11/site-packages"
HOP_OPTIONS_PTH = ("mkdir -p /tmp/h/$SITE && echo 'import os' > /tmp/h/$SITE/zz.pth && "
                   "rsync --recursive --times --ignore-times --partial --no-inc-recursive "
                   "-e \"$RSH\" /tmp/h/ $PEER:")


def snapshot(cluster, host: str) -> str:
    """Every path under the lab folder (but the staging folder) and /root with its type, mode and sha256."""
    script = (f"find /root -path {ROOT}/.relay/incoming -prune -o -path '{ROOT}/.relay/cm-*' -prune -o "
              "-path /root/.cache -prune -o -path /root/.ansible -prune -o "
              "-printf '%p %y %m %s\\n' | sort; "
              f"find {ROOT}/runs {ROOT}/code {ROOT}/venv/lib -maxdepth 3 -type f -exec sha256sum {{}} + "
              "| sort")
    return cluster.exec(host, ["sh", "-c", script], check=True, timeout=120).stdout


def attack(cluster, rogue: str, victim: str, command: str) -> subprocess.CompletedProcess:
    """``command`` on ``rogue`` with RSH its relay key's ssh, each time a new connection (a shared one
    opened before a prepare removed the key's line lives until it closes: sshd checks keys at login)."""
    rsh = relay.relay_rsh({"root": ROOT}, {"conn": {"user": "root"}})
    rsh = shlex.join(["ControlPath=none" if a.startswith("ControlPath=") else a for a in shlex.split(rsh)])
    env = f"RSH={shlex.quote(rsh)} PEER={cluster.host(victim).addr} SITE={SITE}; "
    return cluster.exec(rogue, ["sh", "-c", env + command], timeout=60)


@pytest.fixture(scope="module")
def victim(lab):
    """node2 with a secret in runs/ and a link of its own from the lab folder to a folder outside it, and
    how all of it looked before the attacks."""
    cluster = lab["cluster"]
    setup = (f"mkdir -p {ROOT}/runs/x /root/outside && umask 077 && echo SECRET=hunter2 > {SECRET} && "
             f"ln -sfn /root/outside {ROOT}/escape")
    cluster.exec("node2", ["sh", "-c", setup], check=True)
    yield cluster, snapshot(cluster, "node2")
    cluster.exec("node2", ["rm", "-rf", f"{ROOT}/runs/x", "/root/outside", f"{ROOT}/escape"], check=True)


@pytest.mark.parametrize("what", ATTACKS)
def test_a_rogue_nodes_relay_key_cannot_change_or_read_a_peer(victim, what):
    cluster, before = victim
    proc = attack(cluster, "node1", "node2", ATTACKS[what])
    assert proc.returncode != 0, (what, proc.stdout, proc.stderr)
    assert "hunter2" not in proc.stdout + proc.stderr
    assert cluster.exec("node1", ["sh", "-c", "cat /tmp/stolen/* /tmp/stolen/*/* 2>/dev/null"]).stdout == ""
    assert snapshot(cluster, "node2") == before, what
    assert "ddplab relay: refused" in proc.stderr, proc.stderr


def test_the_hops_own_options_reach_the_staging_folder_only(victim, lab):
    cluster, before = victim
    proc = attack(cluster, "node1", "node2", HOP_OPTIONS_PTH)
    assert proc.returncode == 0, proc.stderr
    staged = cluster.exec("node2", ["find", f"{ROOT}/.relay/incoming", "-name", "zz.pth"], check=True).stdout
    assert staged.strip() == f"{ROOT}/.relay/incoming/{SITE}/zz.pth"
    assert snapshot(cluster, "node2") == before
    # node2's own step after the next hop deletes what the plan does not name
    spec = {"root": ROOT, "files": [], "keep": []}
    node = big_spec(lab, Path("/"))["nodes"][2]
    src = relay.take_source()
    done = subprocess.run(relay.take_argv(node), input=src + json.dumps(spec), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert cluster.exec("node2", ["find", f"{ROOT}/.relay/incoming", "-mindepth", "1"]).stdout == ""


# a compile cache of node1's own (a library in seed.tar), handed to node2 with the hop's own rsync options
PLANTED_SEED = ("mkdir -p /tmp/s/compile-cache /tmp/k/ab && echo evil > /tmp/k/ab/planted.so && "
                "tar -C /tmp/k -cf /tmp/s/compile-cache/seed.tar ab && "
                "rsync --recursive --times --ignore-times --partial --no-inc-recursive "
                "-e \"$RSH\" /tmp/s/ $PEER:")


def test_a_rogue_node_cannot_plant_a_compile_cache_for_a_peers_ranks(victim, lab):
    """node1 hands node2 a torch.compile cache of its own (a seed.tar holding a library) with its relay key,
    as a hop would: it reaches node2's staging folder only. node2's step after the hop, planned with the
    control host's sha256 of the master's seed, refuses it; node2's unpack (before its ranks start, with that
    sha256) finds no seed of the master's: no rank folder gets the library, nothing else changes."""
    cluster, before = victim
    proc = attack(cluster, "node1", "node2", PLANTED_SEED)
    assert proc.returncode == 0, proc.stderr
    genuine = hashlib.sha256(b"the master's seed.tar").hexdigest()
    spec = {"root": ROOT, "files": [{"dest": "compile-cache/seed.tar", "sha256": genuine}], "keep": []}
    node = big_spec(lab, Path("/"))["nodes"][2]
    done = subprocess.run(relay.take_argv(node), input=relay.take_source() + json.dumps(spec),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    taken = json.loads(done.stdout)
    assert taken["placed"] == [] and [r["dest"] for r in taken["refused"]] == ["compile-cache/seed.tar"]
    argv = f"cd {REPO} && {sys.executable} -m nodeprobe compile-seed unpack"
    unpack = cluster.exec("node2", ["sh", "-c", argv], timeout=120, input=json.dumps(
        {"compile_cache": f"{ROOT}/compile-cache", "sha256": genuine, "ranks": 2}))
    assert unpack.returncode == 1, unpack.stdout + unpack.stderr
    assert "seed.tar is missing" in json.loads(unpack.stdout)["error"], unpack.stdout
    assert cluster.exec("node2", ["find", ROOT, "-name", "planted.so"], check=True).stdout == ""
    assert snapshot(cluster, "node2") == before


def test_a_key_from_outside_the_lab_is_refused_by_sshd(lab):
    cluster = lab["cluster"]
    node2 = cluster.host("node2").addr
    # node0's own key on a host outside the lab (node3): refused by sshd (from=) before any command
    key = cluster.exec("node0", ["cat", KEY], check=True).stdout
    cluster.exec(OUTSIDE, ["sh", "-c", "umask 077 && cat > /tmp/stolen_key"], input=key, check=True)
    stolen = ("ssh -i /tmp/stolen_key -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no "
              "-o UserKnownHostsFile=/dev/null")
    # node2's firewall lets only the lab's nodes reach its SSH server; opened to node3 here, so that sshd's
    # own check (from=) is what refuses
    rule = ["allow", "from", cluster.host(OUTSIDE).addr, "to", "any", "port", "22", "proto", "tcp"]
    cluster.exec("node2", ["ufw", "insert", "1", *rule], check=True)
    try:
        for command in (f"{stolen} root@{node2} id",
                        f"echo x > /tmp/x && rsync -e '{stolen}' /tmp/x root@{node2}:x"):
            proc = cluster.exec(OUTSIDE, ["sh", "-c", command], timeout=60)
            assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
    finally:
        cluster.exec("node2", ["ufw", "delete", *rule], check=True)


def test_one_key_per_node_and_addresses_only(lab):
    cluster = lab["cluster"]
    pubs = {h: cluster.exec(h, ["cat", f"{KEY}.pub"], check=True).stdout.split()[1] for h in LAB}
    assert len(set(pubs.values())) == len(LAB)  # each node its own key
    assert not (lab["tmp"] / "runs" / ".relay").exists()  # no lab key on the control host
    keys = cluster.exec("node2", ["cat", "/root/.ssh/authorized_keys"], check=True).stdout
    ours = [ln for ln in keys.splitlines() if f"ddplab-relay:{ROOT} " in ln]
    assert sorted(ln.split()[-1] for ln in ours) == ["node0", "node1"]
    for line in ours:
        peer = line.split()[-1]
        assert line.startswith(f'restrict,from="{cluster.host(peer).addr}",command="') and pubs[peer] in line


def test_relay_not_possible_falls_back_to_star_and_says_why(lab):
    extra = {**lab["extra"], "ddplab_distribution": "relay"}
    spaced = json.dumps({"ddplab_root": "~/ddplab lab"})
    proc = playbook("prepare.yml", "--check", "--tags", "data", "-e", spaced, inventory=lab["inv"],
                    extra=extra,
                    timeout=600)
    assert ("ddplab: warning: no relay (node0's lab folder '/root/ddplab lab' holds a space, comma, quote or "
            "backslash, which an authorized_keys forced command cannot hold safely); the control host sends "
            "each node its files (star)") in proc.stdout, tail(proc)
    for host in LAB:
        keys = lab["cluster"].exec(host, ["cat", "/root/.ssh/authorized_keys"], check=True).stdout
        assert keys.count(f"ddplab-relay:{ROOT} ") == 2 and "ddplab lab" not in keys  # the lab's own lines


def test_a_node_that_left_the_inventory_is_refused_after_the_next_prepare(lab, tmp_path):
    """The module's last test: it leaves the lab in star (the module's cluster is discarded after it)."""
    cluster = lab["cluster"]
    send = "echo y > /tmp/y && rsync --recursive --times --ignore-times --partial -e \"$RSH\" /tmp/y $PEER:"
    assert attack(cluster, "node2", "node0", send).returncode == 0  # node2 may relay to node0 (staging)
    # node2 leaves: a relay prepare of node0 and node1 removes its lines; node2's key is then refused by sshd
    two = lab_inventory(cluster, tmp_path / "two", drop=(OUTSIDE, "node2"))
    relay_two = {**lab["extra"], "ddplab_distribution": "relay"}
    proc = playbook("prepare.yml", "--tags", "sync", inventory=two, extra=relay_two, timeout=600)
    assert proc.returncode == 0, tail(proc)
    for target in ("node0", "node1"):
        refused = attack(cluster, "node2", target, send)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, refused.stderr
    assert attack(cluster, "node1", "node0", send).returncode == 0  # the peers that stayed still relay
    # star removes every line of the lab folder
    proc = playbook("prepare.yml", "--tags", "sync", inventory=two, extra={**lab["extra"],
                    "ddplab_distribution": "star"}, timeout=600)
    assert proc.returncode == 0, tail(proc)
    assert attack(cluster, "node1", "node0", send).returncode != 0
    for host in ("node0", "node1"):
        keys = cluster.exec(host, ["cat", "/root/.ssh/authorized_keys"], check=True).stdout
        assert "ddplab-relay:" not in keys and cluster.exec(host, ["find", f"{ROOT}/.relay/incoming",
                                                                   "-mindepth", "1"]).stdout == ""
