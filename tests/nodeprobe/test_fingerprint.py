"""fingerprint on a real shard folder (trainer.data prepare) with a changed, an extra, a missing shard."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprobe import hashing
from tests.helpers.probes import REPO, probe


def _cpu_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fp") / "shards"
    subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(out), "--docs", "512",
                    "--rows-per-group", "16", "--groups-per-shard", "4"],
                   check=True, cwd=REPO, timeout=120, capture_output=True)
    return out


def test_shard_set_matches_its_manifest(shards):
    s = hashing.shard_set(shards)
    manifest, err = hashing.load_manifest(shards / "manifest.json")
    assert err is None and s["count"] == len(manifest["files"]) >= 4
    assert s["digest"] == manifest["digest"] == s["manifest_digest"]
    assert s["vs_manifest"] == {"missing": [], "extra": [], "changed": []}


def test_fingerprint_names_changed_extra_missing_shards(shards, tmp_path):
    node = tmp_path / "node_shards"
    shutil.copytree(shards, node)
    names = sorted(p.name for p in node.glob("*.parquet"))
    changed, missing = names[1], names[2]
    data = bytearray((node / changed).read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, different content
    (node / changed).write_bytes(bytes(data))
    (node / missing).unlink()
    shutil.copy(node / names[0], node / "shard_99999.parquet")
    code = tmp_path / "code"
    shutil.copytree(REPO / "nodeprobe", code, ignore=shutil.ignore_patterns("__pycache__"))

    fp = probe("fingerprint", "--data", str(node), "--threads", "64", "--dtype", "bf16", "--code", str(code),
               "--depth", "2")
    assert fp["data"]["vs_manifest"] == {"missing": [missing], "extra": ["shard_99999.parquet"],
                                         "changed": [changed]}
    assert (node / changed).stat().st_size == (shards / changed).stat().st_size
    assert fp["data"]["files"][names[0]] == hashing.sha256_file(shards / names[0])

    import torch

    assert fp["torch"]["version"] == torch.__version__
    assert fp["torch"]["git_version"] == torch.version.git_version
    assert fp["torch"]["gloo_available"] is torch.distributed.is_gloo_available()
    assert fp["python"]["major_minor"] == "{}.{}".format(*sys.version_info[:2])

    has_bf16 = bool({"avx512_bf16", "amx_bf16"} & _cpu_flags())
    assert fp["cpu"]["bf16_units"] is has_bf16
    assert fp["dtype"]["resolved"] == "bf16"
    assert (fp["dtype"]["problem"] is None) is has_bf16  # bf16 without the units is a problem

    cpu = fp["cpu"]
    assert 1 <= cpu["physical_cores"] <= cpu["logical"] and cpu["threads"] == 64

    mem = fp["memory"]
    assert mem["estimate_method"] == "trainer.model.estimate_train_memory"
    assert 0 < mem["estimate_bytes"] < mem["total_bytes"] and mem["available_bytes"] > 0

    # the code hash: the copy hashes like the original; one changed byte changes it
    assert fp["code"]["code"]["sha256"] == hashing.tree_hash(REPO / "nodeprobe")["sha256"]
    (code / "gather.py").write_text((code / "gather.py").read_text() + "\n")
    assert hashing.tree_hash(code)["sha256"] != fp["code"]["code"]["sha256"]


def test_stdlib_parts_missing_folder_dtype_rules_and_estimate(tmp_path):
    from nodeprobe.fingerprint import dtype_info, estimate_own

    # the stdlib parts, without torch: same answers as the probe would give
    assert hashing.shard_set(tmp_path / "nope")["error"].endswith("does not exist")
    assert dtype_info("auto", False)["resolved"] == "fp32"
    assert dtype_info("auto", True, allow_bf16=True)["resolved"] == "bf16"
    assert dtype_info("bf16", False)["problem"]
    need, parts = estimate_own({"depth": 2, "n_embd": 128, "n_head": 2, "seq_len": 128, "batch_size": 8,
                                "vocab": 257, "world_size": 2})
    assert parts["params"] == 2 * 257 * 128 + 2 * 12 * 128 * 128  # the trainer's exact count
    assert need == parts["state_bytes"] + parts["activation_bytes"]


def test_disk_facts_read_the_lab_folders_own_file_system(tmp_path):
    """A 4 MiB tmpfs as the node's disk: the probe reports its free bytes, which fall as it fills."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs: needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True, timeout=30)
    try:
        lab = disk / "ddplab"  # not made yet: its nearest existing parent counts
        before = probe("fingerprint", "--root", str(lab), "--threads", "1")["disk"]
        assert before["path"] == str(disk) and before["total_bytes"] == 4 << 20
        assert before["checkpoint_bytes"] > 0 and before["checkpoints"] == 4
        (disk / "fill.bin").write_bytes(b"\0" * (3 << 20))
        after = probe("fingerprint", "--root", str(lab), "--threads", "1")["disk"]
        assert after["free_bytes"] <= before["free_bytes"] - (3 << 20)
    finally:
        subprocess.run(["umount", str(disk)], check=True, timeout=30)


@pytest.mark.parametrize("kind", ["v1", "v2"])
def test_the_memory_limit_is_the_tightest_of_the_process_cgroup_and_its_parents(tmp_path, kind):
    """A rank's cap is its own cgroup's limit or a parent's (a lab slice), whichever is lower; v1 says "no
    limit" as ~2^63, v2 as "max"."""
    from nodeprobe.fingerprint import cgroup_memory_limit

    proc, root = tmp_path / "proc", tmp_path / "cgroup"
    proc.mkdir()
    name, none = ("memory.limit_in_bytes", str(2**63 - 4096)) if kind == "v1" else ("memory.max", "max")
    fs = "cgroup cgroup rw,memory" if kind == "v1" else "cgroup2 cgroup2 rw"
    (proc / "mountinfo").write_text(f"30 23 0:9 / {root} rw,relatime - {fs}\n")
    (proc / "cgroup").write_text(("4:memory:" if kind == "v1" else "0::") + "/lab/node1\n")
    for folder, value in ((root, none), (root / "lab", str(3 << 30)), (root / "lab" / "node1", none)):
        folder.mkdir(exist_ok=True)
        (folder / name).write_text(value + "\n")
    assert cgroup_memory_limit(proc) == 3 << 30
    (root / "lab" / "node1" / name).write_text(str(96 << 20))
    assert cgroup_memory_limit(proc) == 96 << 20
    (proc / "cgroup").write_text("4:cpu:/lab/node1\n")  # not in a memory cgroup: no limit known
    assert cgroup_memory_limit(proc) is None
