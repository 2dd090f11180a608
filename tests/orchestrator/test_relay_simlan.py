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
from tests.helpers.playbooks import REPO, make_shards, playbook, recap, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

LAB = ("node0", "node1", "node2")
OUTSIDE = "node3"
ROOT = "/root/ddplab"  # ddplab_root (~/ddplab) of a root simlan host
KEY = f"{ROOT}/{relay.KEY_FILE}"
BIG_MB = 48


def lab_inventory(cluster, folder: Path) -> Path:
    """The simlan inventory without node3."""
    inv = folder / "inventory"
    (inv / "group_vars" / "all").mkdir(parents=True)
    src = Path(cluster.inventory_dir)
    hosts = yaml.safe_load((src / "hosts.yml").read_text())
    workers = hosts["all"]["children"]["ddplab_nodes"]["children"]["ddplab_workers"]["hosts"]
    del workers[OUTSIDE]
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
    assert all(r["changed"] == 0 for r in recap(proc).values()), tail(proc)
    assert "PRIVATE KEY" not in proc.stdout + proc.stderr
    private = (lab["tmp"] / "runs" / ".relay" / "id_ed25519").read_text().splitlines()[1]
    assert private not in proc.stdout + proc.stderr


def big_spec(lab, folder: Path) -> dict:
    inv = yaml.safe_load((lab["inv"] / "group_vars" / "all" / "simlan.yml").read_text())
    nodes = []
    for name in LAB:
        addr = lab["cluster"].host(name).addr
        conn = {"local": False, "host": addr, "user": "root", "port": None,
                "key": inv["ansible_ssh_private_key_file"], "ssh_args": "",
                "common_args": inv["ansible_ssh_common_args"], "extra_args": ""}
        nodes.append({"name": name, "root": ROOT, "addr": addr, "conn": conn, "base": f"{ROOT}/big",
                      "src_dir": str(folder), "files": ["big.bin"]})
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
    # node0 -> node1 is).
    cluster.exec("node0", ["tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", "100mbit", "burst",
                           "256kb", "latency", "50ms"], check=True)
    argv = [sys.executable, "-m", "ddplab", "relay", "--progress", progress]
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, text=True, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.stdin.write(spec)
    proc.stdin.close()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until node1's temporary copy holds some of the file
        tmp = cluster.exec("node1", ["sh", "-c", f"find {ROOT}/big -name '.big.bin.*' -size +1M"]).stdout
        if tmp.strip():
            break
        time.sleep(0.1)
    # The interruption: node1's receiving rsync (the one process writing that temporary file) is ended as a
    # lost link or reboot would, and so is the control host's job (a playbook stopped with Ctrl-C).
    cluster.exec("node1", ["sh", "-c", f"fuser -k -TERM {ROOT}/big/.big.bin.*"], timeout=30)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    cluster.exec("node0", ["tc", "qdisc", "del", "dev", "eth0", "root"], check=True)
    time.sleep(2)
    sizes = {h: cluster.exec(h, ["sh", "-c", f"stat -c %s {ROOT}/big/big.bin 2>/dev/null || echo 0"]).stdout
             for h in LAB}
    assert int(sizes["node0"]) == BIG_MB << 20 and 0 < int(sizes["node1"]) < BIG_MB << 20, sizes  # --partial
    before = tx_bytes()
    again = subprocess.run(argv, cwd=REPO, input=spec, text=True, capture_output=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert tx_bytes() - before < (BIG_MB << 20) / 2  # node0 had it all: nothing resent from the control host
    assert json.loads(again.stdout)["fallbacks"] == []
    for host in LAB:
        assert cluster.exec(host, ["sha256sum", f"{ROOT}/big/big.bin"], check=True).stdout.split()[0] == want


def test_the_lab_key_only_rsyncs_into_the_lab_folder(lab, tmp_path):
    cluster = lab["cluster"]
    node2 = cluster.host("node2").addr
    rsh = relay.relay_rsh({"root": ROOT}, {"conn": {"user": "root"}})
    inside = {
        "shell": f"{rsh} {node2} 'touch /root/pwned; id'",
        "write outside": f"echo x > /tmp/x && rsync -e {shlex.quote(rsh)} /tmp/x {node2}:/root/.ssh/pwned",
        "climb out": f"rsync -e {shlex.quote(rsh)} /tmp/x {node2}:../pwned",
        "read": f"rsync -e {shlex.quote(rsh)} {node2}:data/ /tmp/stolen/",
        "delete": f"mkdir -p /tmp/e && rsync -r --delete -e {shlex.quote(rsh)} /tmp/e/ {node2}:data/",
    }
    for what, command in inside.items():
        proc = cluster.exec("node1", ["sh", "-c", command], timeout=60)
        assert proc.returncode != 0, (what, proc.stdout, proc.stderr)
    assert cluster.exec("node2", ["ls", "/root/pwned", "/root/.ssh/pwned"]).returncode != 0
    assert cluster.exec("node2", ["sh", "-c", f"ls {ROOT}/data/*.parquet"]).returncode == 0  # nothing deleted
    # the same key on a host outside the lab (node3): refused by sshd (from=) before any command
    key = cluster.exec("node0", ["cat", KEY], check=True).stdout
    cluster.exec(OUTSIDE, ["sh", "-c", "umask 077 && cat > /tmp/stolen_key"], input=key, check=True)
    stolen = ("ssh -i /tmp/stolen_key -o IdentitiesOnly=yes -o BatchMode=yes -o StrictHostKeyChecking=no "
              "-o UserKnownHostsFile=/dev/null")
    for command in (f"{stolen} root@{node2} id",
                    f"echo x > /tmp/x && rsync -e '{stolen}' /tmp/x root@{node2}:x"):
        proc = cluster.exec(OUTSIDE, ["sh", "-c", command], timeout=60)
        assert proc.returncode != 0 and "Permission denied" in proc.stderr, proc.stderr
    # and the one thing it may do, from inside: write into the lab folder
    ok = cluster.exec("node1", ["sh", "-c",
                                f"echo y > /tmp/y && rsync -e {shlex.quote(rsh)} /tmp/y {node2}:y"])
    assert ok.returncode == 0, ok.stderr
    assert cluster.exec("node2", ["cat", f"{ROOT}/y"], check=True).stdout == "y\n"
    cluster.exec("node2", ["rm", f"{ROOT}/y"], check=True)


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
        assert keys.count("ddplab-relay:") == 1 and "ddplab lab" not in keys  # only the lab's own line
