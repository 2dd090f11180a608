"""ddplab_sync_dirs on 2 simulated hosts: a data folder outside the code (8 files; DDPLAB_SYNC_DATA_MB sets
the size: 128 MiB in the suite, the 1 GiB figures of docs/your-code.md were taken with 1024) synced once,
then changed by one file (only that file travels: its node copy is the only new inode); a file a user made
in the node's folder stays through later syncs; preflight names the node whose copy differs, in one FAIL
line, and passes after prepare. The times are printed (pytest -s) for the record.

One cluster serves the module; the `synced` fixture does the two timed syncs, so each test also runs alone.
"""

import hashlib
import json
import os
import re
import subprocess
import time

import pytest

from tests.helpers.playbooks import playbook, recap, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

TOTAL_MB = int(os.environ.get("DDPLAB_SYNC_DATA_MB", "128"))
PARTS = 8
HOSTS = ("node0", "node1")
NODE_DIR = "/root/ddplab/data/big"  # dest "data/big": relative to ddplab_root (~/ddplab)
ABS_DIR = "/root/ddplab/abs-small"  # an absolute dest


def sent(proc, label) -> dict[str, str]:
    """Each node's last progress line of the transfer of one folder (roles/code_sync/tasks/push.yml)."""
    return dict(re.findall(rf"^{re.escape(label)} to (node\d): (sent .+)$", proc.stdout, re.MULTILINE))


def inodes(cluster, host) -> dict[str, str]:
    out = cluster.exec(host, ["stat", "-c", "%n %i", *[f"{NODE_DIR}/part{i}.bin" for i in range(PARTS)]],
                       timeout=60, check=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


@pytest.fixture(scope="module")
def setup(simlan_cluster, tmp_path_factory):
    cluster = simlan_cluster(2, fresh=True)
    tmp = tmp_path_factory.mktemp("sync-dirs")
    big, small, code = tmp / "big", tmp / "small", tmp / "code"
    big.mkdir()
    (small / "tok").mkdir(parents=True)
    code.mkdir()
    (code / "train.py").write_text("print('data comes from ddplab_sync_dirs')\n")
    block = os.urandom(1 << 20)
    for i in range(PARTS):
        with open(big / f"part{i}.bin", "wb") as f:
            for _ in range(TOTAL_MB // PARTS):
                f.write(block)
    (small / "tok" / "vocab.json").write_text('{"a": 0}\n')
    sync = [{"src": str(big), "dest": "data/big"}, {"src": str(small), "dest": ABS_DIR}]
    extra = {"ddplab_data_dir": "", "ddplab_code_dir": code, "ddplab_entrypoint": "train.py",
             "ddplab_runs_dir": tmp / "runs"}
    yield {"cluster": cluster, "big": big, "small": small, "extra": extra,
           "sync": ["-e", json.dumps({"ddplab_sync_dirs": sync})], "runs": tmp / "runs"}
    simlan_cluster.discard()  # the big folder in each host's lab folder


def prepare(setup, *tags):
    return playbook("prepare.yml", *tags, *setup["sync"], inventory=setup["cluster"].inventory_dir,
                    extra=setup["extra"], timeout=1200)


def preflight(setup):
    return playbook("preflight.yml", *setup["sync"], inventory=setup["cluster"].inventory_dir,
                    extra=setup["extra"], timeout=600)


@pytest.fixture(scope="module")
def synced(setup):
    """The full prepare (first sync, timed), then one file changed and prepare --tags sync (timed)."""
    cluster = setup["cluster"]
    t0 = time.monotonic()
    first = prepare(setup)
    t_first = time.monotonic() - t0
    assert first.returncode == 0, tail(first)
    before = {h: inodes(cluster, h) for h in HOSTS}
    with open(setup["big"] / "part3.bin", "r+b") as f:
        f.write(b"changed")
    t0 = time.monotonic()
    second = prepare(setup, "--tags", "sync")
    t_second = time.monotonic() - t0
    assert second.returncode == 0, tail(second)
    print(f"\nddplab_sync_dirs {TOTAL_MB} MiB in {PARTS} files to 2 hosts: first sync in the full "
          f"prepare.yml {t_first:.1f} s ({sent(first, 'data/big')}); one file changed, prepare.yml --tags "
          f"sync {t_second:.1f} s ({sent(second, 'data/big')})")
    return {"first": first, "second": second, "before": before}


def test_a_data_folder_travels_once_then_only_the_changed_file(setup, synced):
    cluster = setup["cluster"]
    first, second = sent(synced["first"], "data/big"), sent(synced["second"], "data/big")
    assert sorted(first) == sorted(second) == list(HOSTS), tail(synced["second"])
    assert all(f"{PARTS} files: part0.bin, part1.bin, part2.bin ..." in ln for ln in first.values()), first
    assert all(ln.endswith("1 file: part3.bin") for ln in second.values()), second
    assert sent(synced["second"], ABS_DIR) == {}  # unchanged: nothing started
    local = {p.name: p for p in setup["big"].iterdir()}
    for h in HOSTS:
        after = inodes(cluster, h)
        assert [n for n in after if after[n] != synced["before"][h][n]] == [f"{NODE_DIR}/part3.bin"]
        sums = cluster.exec(h, ["sha256sum", f"{NODE_DIR}/part3.bin", f"{ABS_DIR}/tok/vocab.json"],
                            timeout=120, check=True).stdout.split()
        assert len(sums) == 4
    assert sums[0] == hashlib.sha256(local["part3.bin"].read_bytes()).hexdigest()


def test_a_file_the_user_made_in_a_sync_dir_is_kept(setup, synced):
    cluster = setup["cluster"]
    cluster.exec("node1", ["sh", "-c", f"echo mine > {NODE_DIR}/notes.txt"], timeout=30, check=True)
    (setup["small"] / "tok" / "vocab.json").unlink()
    (setup["small"] / "tok" / "merges.txt").write_text("a b\n")
    proc = prepare(setup, "--tags", "sync")
    assert proc.returncode == 0, tail(proc)
    for h in HOSTS:
        ls = cluster.exec(h, ["find", ABS_DIR, "-type", "f"], timeout=30, check=True).stdout.split()
        assert sorted(ls) == [f"{ABS_DIR}/.ddplab-sync-files.json", f"{ABS_DIR}/tok/merges.txt"]
    kept = cluster.exec("node1", ["cat", f"{NODE_DIR}/notes.txt"], timeout=30, check=True).stdout
    assert kept == "mine\n"
    assert sent(proc, "data/big") == {}  # the user's file neither travels nor counts as a difference


def test_preflight_names_the_node_whose_sync_dir_differs_and_passes_after_prepare(setup, synced):
    cluster = setup["cluster"]
    cluster.exec("node1", ["sh", "-c", f"echo extra >> {NODE_DIR}/part5.bin"], timeout=30, check=True)
    proc = preflight(setup)
    assert proc.returncode != 0, tail(proc)
    verdict = json.loads((setup["runs"] / "preflight" / "latest.json").read_text())
    failures = [(f["host"], f["check"], f["detail"]) for f in verdict["failures"]]
    assert len(failures) == 1 and failures[0][:2] == ("node1", "sync_dirs"), failures
    line = f"FAIL node1 sync_dirs: {failures[0][2]}"
    assert line.startswith(f"FAIL node1 sync_dirs: data/big/ differs from {setup['big']} on the control host")
    assert line in proc.stdout, tail(proc)
    assert verdict["hosts"]["node0"]["sync_dirs"]["status"] == "ok"

    fixed = prepare(setup, "--tags", "sync")
    assert fixed.returncode == 0, tail(fixed)
    assert sent(fixed, "data/big") == {"node1": sent(fixed, "data/big")["node1"]}
    again = preflight(setup)
    assert again.returncode == 0, tail(again)


def test_a_link_out_of_the_code_or_a_sync_dir_is_refused_before_any_node_changes(setup, tmp_path):
    """A hostile repository: a tracked `vocab.txt -> ../../.ssh/id_ed25519` leads to a fake control-host key
    outside the checkout (rsync --copy-links would send the key itself), and a sync dir holds a link to it
    too. validate names both before any node changes; a link that stays inside its folder is fine."""
    cluster, home = setup["cluster"], tmp_path / "home"
    key = home / ".ssh" / "id_ed25519"
    key.parent.mkdir(parents=True)
    key.write_text(f"FAKE-CONTROL-KEY-{os.urandom(8).hex()}\n")
    repo = home / "src" / "repo"
    repo.mkdir(parents=True)
    (repo / "train.py").write_text("print('hostile')\n")
    (repo / "README").write_text("ok\n")
    (repo / "README.link").symlink_to("README")  # stays inside: still sent
    (repo / "vocab.txt").symlink_to("../../.ssh/id_ed25519")
    commit = ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]
    for args in (["init", "-q"], ["add", "."], commit):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, timeout=60)
    data = tmp_path / "data"
    data.mkdir()
    (data / "tok.json").write_text("{}\n")
    (data / "secret.bin").symlink_to(key)
    sync = [{"src": str(data), "dest": "data/hostile"}]
    proc = playbook("prepare.yml", "--tags", "code,sync", "-e",
                    json.dumps({"ddplab_code_dir": str(repo), "ddplab_sync_dirs": sync}),
                    inventory=cluster.inventory_dir, extra=setup["extra"], timeout=900)
    secret = key.read_text().strip()
    for h in HOSTS:  # the key's text is nowhere in the node's lab folder (the old code copied it twice)
        found = cluster.exec(h, ["grep", "-rlF", secret, "/root/ddplab"], timeout=60).stdout.split()
        assert found == [], (h, found)
    assert proc.returncode != 0, tail(proc)
    out = " ".join(proc.stdout.split())
    assert (f"ddplab: error: ddplab_code_dir (all): {repo}/vocab.txt is a link to {key}, outside {repo}; "
            "only files inside the folder are sent") in out, tail(proc)
    assert f"ddplab_sync_dirs (all): {data}/secret.bin is a link to {key}, outside {data}" in out, tail(proc)
    assert "replace the link with a copy of the file" in out and "Traceback" not in proc.stdout + proc.stderr


def test_a_file_name_with_a_newline_syncs_and_is_pruned_inside_its_folder(setup, synced):
    """A real file named "notes<newline>..": the old prune read the node's sums line by line, so the second
    prepare removed `<folder>/..`, here ABS_DIR/.. = the lab folder. Now the name is one name throughout: it
    syncs, a second prepare changes nothing, and once it leaves the source only that file goes."""
    cluster, evil = setup["cluster"], "notes\n.."
    source = setup["small"] / evil
    source.write_text("a name with a newline\n")
    def lab_intact():
        for h in HOSTS:
            lab = cluster.exec(h, ["ls", "-A", "/root/ddplab", ABS_DIR, NODE_DIR], timeout=30).stdout
            assert ".ddplab-lab" in lab and "tok" in lab and "part0.bin" in lab, f"{h}: {lab}"

    try:
        runs = [prepare(setup, "--tags", "sync") for _ in range(2)]
        lab_intact()  # the old code's second prepare removed /root/ddplab here
        assert [p.returncode for p in runs] == [0, 0], tail(runs[0]) + tail(runs[1])
        assert {h: r["changed"] for h, r in recap(runs[1]).items()} == {h: 0 for h in HOSTS}, tail(runs[1])
        for h in HOSTS:
            copy = cluster.exec(h, ["cat", f"{ABS_DIR}/{evil}"], timeout=30, check=True).stdout
            assert copy == "a name with a newline\n"
        source.unlink()
        pruned = prepare(setup, "--tags", "sync")
        assert pruned.returncode == 0, tail(pruned)
        for h in HOSTS:
            assert cluster.exec(h, ["test", "-e", f"{ABS_DIR}/{evil}"], timeout=30).returncode != 0
        lab_intact()
    finally:
        source.unlink(missing_ok=True)


def test_a_copy_that_does_not_fit_is_refused_before_anything_travels(setup, synced, tmp_path):
    """node1's folder for one more sync dir is on a 4 MiB tmpfs (another file system than the lab folder's);
    8 MiB to copy there: one message names the node, the folder, need and free; nothing reaches it."""
    cluster, tiny = setup["cluster"], "/root/tiny"
    cluster.exec("node1", ["sh", "-c", f"mkdir -p {tiny} && mount -t tmpfs -o size=4m tmpfs {tiny}"],
                 timeout=30, check=True)
    try:
        (tmp_path / "eight").mkdir()
        (tmp_path / "eight" / "blob.bin").write_bytes(os.urandom(8 << 20))
        sync = [*json.loads(setup["sync"][1])["ddplab_sync_dirs"],
                {"src": str(tmp_path / "eight"), "dest": f"{tiny}/data"}]
        proc = playbook("prepare.yml", "--tags", "sync", "-e", json.dumps({"ddplab_sync_dirs": sync}),
                        inventory=cluster.inventory_dir, extra=setup["extra"], timeout=600)
        assert proc.returncode != 0, tail(proc)
        assert re.search(rf"ddplab: error: node1: {tiny}/data needs 8\.0 MiB \({8 << 20} bytes, 1 files\) "
                         rf"and its file system \({tiny}/data\) has 4\.0 MiB free", proc.stdout), tail(proc)
        assert "Traceback" not in proc.stdout + proc.stderr
        assert cluster.exec("node1", ["find", tiny, "-type", "f"], timeout=30, check=True).stdout == ""
    finally:
        cluster.exec("node1", ["umount", tiny], timeout=30)
        for h in HOSTS:
            cluster.exec(h, ["rm", "-rf", tiny], timeout=30)
