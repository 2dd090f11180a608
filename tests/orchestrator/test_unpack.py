"""ddplab/unpack.py: an archive a node sent writes nothing outside its folder on the control host.

Crafted archives (a chain of links that tarfile's `data` filter on Python 3.11.7 does not see through, a
plain link then a file through it, a hard link, `..`, an absolute path, a device, a fifo, a file where an
earlier collect left a link to outside) are refused whole, with one line naming the member; a real archive
packed by nodeprobe/pack_run.py unpacks as the `data` filter unpacked it.
"""

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from ddplab import unpack
from ddplab.errors import DdplabError
from tests.helpers.playbooks import REPO


def member(name, kind=tarfile.REGTYPE, data=b"", link=""):
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size, info.mode = kind, link, len(data), 0o644
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        info.devmajor, info.devminor = 1, 3
    return info, io.BytesIO(data) if kind == tarfile.REGTYPE else None


def archive(path, members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, data)
    return path


def realpath_bypass(target_rel: str) -> list:
    """CVE-2025-4517's shape: 16 links to 247-byte folders make a path longer than PATH_MAX, so
    os.path.realpath (the `data` filter's check) stops resolving it; a link through it escapes."""
    comp, steps, out, path = "d" * 247, "abcdefghijklmnop", [], ""
    for s in steps:
        out += [member(os.path.join(path, comp), tarfile.DIRTYPE),
                member(os.path.join(path, s), tarfile.SYMTYPE, link=comp)]
        path = os.path.join(path, comp)
    deep = os.path.join("/".join(steps), "l" * 254)
    return out + [member(deep, tarfile.SYMTYPE, link="../" * len(steps)),
                  member("escape", tarfile.SYMTYPE, link=f"{deep}/{target_rel}"),
                  member("escape/pwned.txt", data=b"written by a node\n")]


def old_unpack(path, dest):
    """What ddplab/report.py did before: tarfile's data filter."""
    with tarfile.open(path) as tar:
        tar.extractall(dest, filter="data")


def tree(root):
    """{relative path: (bytes or 'dir', mode, mtime)} of everything under root, links not followed."""
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
                content = "dir" if os.path.isdir(p) else Path(p).read_bytes()
                out[os.path.relpath(p, root)] = (content, st.st_mode, int(st.st_mtime))
            except OSError as e:  # the old unpacker's chain of links is longer than PATH_MAX
                out[os.path.relpath(p, root)] = (e.strerror, None, None)
    return out


def report_unpack(run_dir, node="node1"):
    """ddplab report's unpack of run_dir/<node>.tgz, as roles/logs runs it on the control host."""
    return subprocess.run([sys.executable, "-m", "ddplab", "report", str(run_dir), f"--unpack={node}",
                           "--no-report"], cwd=REPO, capture_output=True, text=True, timeout=60)


@pytest.fixture
def run(tmp_path):
    """(run folder, the node's folder in it, a folder beside it that a node must not reach)."""
    (tmp_path / "run" / "node1").mkdir(parents=True)
    (tmp_path / "run" / "outside").mkdir()
    (tmp_path / "run" / "outside" / "victim").write_text("the control host's file\n")
    return tmp_path / "run", tmp_path / "run" / "node1", tmp_path / "run" / "outside"


def test_the_old_unpacker_lets_a_node_write_outside_its_folder(run, tmp_path):
    """The attack itself, against the `data` filter of this Python (3.11.7): it succeeds."""
    _, dest, outside = run
    old_unpack(archive(tmp_path / "evil.tgz", realpath_bypass("../outside")), dest)
    assert (outside / "pwned.txt").read_text() == "written by a node\n"


CRAFTED = {
    "realpath bypass": (realpath_bypass("../outside"), "'a'", "is a symbolic link"),
    "symlink then a file through it": ([member("logs", tarfile.SYMTYPE, link="../outside"),
                                        member("logs/pwned.txt", data=b"x")], "'logs'", "is a symbolic link"),
    "hard link": ([member("victim", tarfile.LNKTYPE, link="../outside/victim")], "'victim'",
                  "is a hard link"),
    "dot dot": ([member("ok.txt", data=b"x"), member("out/../../outside/pwned.txt", data=b"x")],
                "'out/../../outside/pwned.txt'", "'..' part"),
    "absolute": ([member("/tmp/ddplab-unpack-pwned.txt", data=b"x")], "'/tmp/ddplab-unpack-pwned.txt'",
                 "is an absolute path"),
    "device": ([member("null", tarfile.CHRTYPE)], "'null'", "is a device"),
    "fifo": ([member("pipe", tarfile.FIFOTYPE)], "'pipe'", "is a fifo"),
    "twice": ([member("a.txt", data=b"1"), member("a.txt", data=b"2")], "'a.txt'", "comes twice"),
    "under a file": ([member("a", data=b"1"), member("a/b", data=b"2")], "'a/b'", "is under a member"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_archive_is_refused_whole_naming_its_member(run, case):
    run_dir, _, outside = run
    members, name, why = CRAFTED[case]
    before = tree(run_dir)
    archive(run_dir / "node1.tgz", members)
    proc = report_unpack(run_dir)
    kept = (run_dir / "node1.tgz").exists()  # for a look
    (run_dir / "node1.tgz").unlink(missing_ok=True)
    assert sorted(os.listdir(outside)) == ["victim"]  # the old unpacker wrote pwned.txt here (the bypass)
    assert tree(run_dir) == before  # nothing written, in the node's folder or beside it
    assert not os.path.exists("/tmp/ddplab-unpack-pwned.txt")
    assert proc.returncode == 1 and kept and "Traceback" not in proc.stderr
    assert len(proc.stderr.splitlines()) == 1 and why in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ddplab: error: node1's archive {run_dir}/node1.tgz is refused: the "
                                  f"member {name} "), proc.stderr


def test_a_file_replaces_a_link_an_earlier_collect_left_without_writing_through_it(run):
    run_dir, dest, outside = run
    (dest / "launch.log").symlink_to(outside / "victim")
    archive(run_dir / "node1.tgz", [member("launch.log", data=b"new log\n")])
    proc = report_unpack(run_dir)
    assert (outside / "victim").read_text() == "the control host's file\n"  # the old unpacker wrote here
    assert proc.returncode == 0, proc.stderr
    assert not (dest / "launch.log").is_symlink() and (dest / "launch.log").read_text() == "new log\n"
    # a folder that is a link is not entered: the member fails there, outside is untouched
    (dest / "out").symlink_to(outside)
    archive(run_dir / "node1.tgz", [member("out/pwned.txt", data=b"x")])
    proc = report_unpack(run_dir)
    assert proc.returncode == 1 and proc.stderr.startswith("ddplab: error: cannot unpack") and \
        "Not a directory: 'out'" in proc.stderr, proc.stderr
    assert sorted(os.listdir(outside)) == ["victim"]


def test_an_archive_too_big_for_its_bound_is_refused_before_writing(run, tmp_path, monkeypatch):
    _, dest, _ = run
    monkeypatch.setattr(unpack, "MAX_BYTES", 10)
    with pytest.raises(DdplabError, match="'big.bin' claims 11 bytes"):
        unpack.unpack(archive(tmp_path / "a.tgz", [member("big.bin", data=b"x" * 11)]), dest)
    with pytest.raises(DdplabError, match="its files hold 12 bytes, more than 10"):
        unpack.unpack(archive(tmp_path / "b.tgz", [member(f"{i}", data=b"x" * 6) for i in range(2)]), dest)
    assert os.listdir(dest) == []


def test_a_real_collected_archive_unpacks_as_before(tmp_path):
    """nodeprobe/pack_run.py's archive of a run folder (with a link inside it): the same files, bytes, modes
    and times as tarfile's data filter gave."""
    node_run = tmp_path / "node" / "runs" / "r1"
    (node_run / "out" / "ckpt").mkdir(parents=True)
    (node_run / "trainer.env").write_text("DDPLAB_RUN_ID=r1\n# ddplab_env\nTOKEN=x\n")
    (node_run / "trainer.env").chmod(0o600)
    (node_run / "launch.log").write_text("step 1 loss 4.2\n")
    (node_run / "out" / "metrics.rank0.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    (node_run / "out" / "summary.rank0.json").write_text("{}\n")
    (node_run / "out" / "ckpt" / "meta.json").write_text("{}\n")
    (node_run / "out" / "latest.json").symlink_to("ckpt/meta.json")
    (node_run / "exit_code").write_text("0\n")
    packed = tmp_path / "node1.tgz"
    subprocess.run([sys.executable, "-m", "nodeprobe", "pack-run", str(node_run), str(packed), "--socket",
                    str(tmp_path / "none.sock"), "--session", "r1", "--pattern", "*.json*", "--pattern",
                    "launch.log", "--pattern", "trainer.env", "--pattern", "exit_code"], cwd=REPO, check=True,
                   capture_output=True, timeout=60)
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    old_unpack(packed, old)
    names = unpack.unpack(packed, new)
    assert "out/latest.json" in names and "pane.txt" in names
    assert tree(new) == tree(old) and (new / "out" / "latest.json").read_text() == "{}\n"
    assert (new / "trainer.env").stat().st_mode & 0o777 == 0o600
