"""Git-ignored data shipped with ddplab_code_include on 2 simulated hosts: a data folder (8 files) synced
once, then one file changed: only that file travels. The times are printed (pytest -s) for the record;
DDPLAB_BIG_DATA_MB sets the size (128 MiB in the suite; the 1 GiB figures were taken with 1024)."""

import os
import re
import subprocess
import time

import pytest

from tests.helpers.playbooks import playbook, tail

pytestmark = [pytest.mark.slow, pytest.mark.simlan]

TOTAL_MB = int(os.environ.get("DDPLAB_BIG_DATA_MB", "128"))
PARTS = 8


def git(cwd, *args):
    subprocess.run(["git", "-C", str(cwd), *args], check=True, capture_output=True, timeout=60)


def sent(proc) -> dict[str, str]:
    """Each node's last progress line of the code transfer (roles/code_sync/tasks/push.yml)."""
    return dict(re.findall(r"^code to (node\d): (sent .+)$", proc.stdout, re.MULTILINE))


def inodes(cluster, host, folder) -> dict[str, str]:
    """name -> inode of the files in a node folder: rsync writes a sent file anew (a new inode)."""
    out = cluster.exec(host, ["stat", "-c", "%n %i", *[f"{folder}/part{i}.bin" for i in range(PARTS)]],
                       timeout=60, check=True).stdout
    return dict(line.rsplit(" ", 1) for line in out.splitlines())


def test_a_big_ignored_data_folder_travels_once_then_only_the_changed_file(simlan_cluster, tmp_path):
    cluster = simlan_cluster(2)
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    (repo / "train.py").write_text("print('data only')\n")
    (repo / ".gitignore").write_text("data/\n")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "code")
    block = os.urandom(1 << 20)
    for i in range(PARTS):
        with open(repo / "data" / f"part{i}.bin", "wb") as f:
            for _ in range(TOTAL_MB // PARTS):
                f.write(block)
    extra = {"ddplab_data_dir": "", "ddplab_code_dir": repo, "ddplab_entrypoint": "train.py",
             "ddplab_runs_dir": tmp_path / "runs"}
    include = '{"ddplab_code_include": ["data/*.bin"]}'
    try:
        t0 = time.monotonic()
        first = playbook("prepare.yml", "--tags", "code", "-e", include, inventory=cluster.inventory_dir,
                         extra=extra, timeout=1200)
        t_first = time.monotonic() - t0
        assert first.returncode == 0, tail(first)
        lines = sent(first)
        assert sorted(lines) == ["node0", "node1"], tail(first)
        assert all(re.match(r"sent \d", ln) for ln in lines.values()), lines  # the code and the data
        folder = "/root/ddplab/code/user/data"
        before = {h: inodes(cluster, h, folder) for h in ("node0", "node1")}
        with open(repo / "data" / "part3.bin", "r+b") as f:
            f.write(b"changed")
        t0 = time.monotonic()
        second = playbook("prepare.yml", "--tags", "code", "-e", include, inventory=cluster.inventory_dir,
                          extra=extra, timeout=1200)
        t_second = time.monotonic() - t0
        assert second.returncode == 0, tail(second)
        lines = sent(second)
        assert sorted(lines) == ["node0", "node1"], tail(second)
        assert all(ln.endswith("1 file: user/data/part3.bin") for ln in lines.values()), lines
        for h in ("node0", "node1"):
            after = inodes(cluster, h, folder)
            assert [n for n in after if after[n] != before[h][n]] == [f"{folder}/part3.bin"], (before, after)
        for host in ("node0", "node1"):
            sums = cluster.exec(host, ["sha256sum", "/root/ddplab/code/user/data/part3.bin"], timeout=120,
                                check=True).stdout.split()[0]
            local = subprocess.run(["sha256sum", str(repo / "data" / "part3.bin")], capture_output=True,
                                   text=True, check=True).stdout.split()[0]
            assert sums == local
        print(f"\nddplab_code_include {TOTAL_MB} MiB in {PARTS} files to 2 hosts: first sync "
              f"{t_first:.1f} s (prepare.yml --tags code), one file changed: {t_second:.1f} s; "
              f"rsync's own lines: {lines}")
    finally:
        simlan_cluster.discard()  # 1 GiB in each host's lab folder
