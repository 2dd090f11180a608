"""bench/shard.py without simulated hosts (no --hosts, no --speed-hosts): it renders table.md and
shard.png from the results kept in --out, and its scratch folder is one it made and removed: a folder at
the path the bench used to remove whoever made it (/var/tmp/ddplab-bench-shard) is left alone."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OLD_PATH = Path("/var/tmp/ddplab-bench-shard")


def scratch_folders() -> set[Path]:
    return set(Path("/var/tmp").glob("ddplab-bench-shard-*"))


def test_the_bench_renders_kept_results_and_removes_only_its_own_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(REPO / "bench" / "results" / "shard" / "results.json", out / "results.json")
    made = not OLD_PATH.exists()
    if made:  # someone's folder at the old fixed path, with their file in it
        OLD_PATH.mkdir()
        (OLD_PATH / "theirs.txt").write_text("not the bench's\n")
    before = scratch_folders()
    try:
        proc = subprocess.run([sys.executable, "bench/shard.py", "--hosts", "--out", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        if made:
            assert (OLD_PATH / "theirs.txt").read_text() == "not the bench's\n"
    finally:
        if made:
            shutil.rmtree(OLD_PATH)
    assert scratch_folders() <= before  # its own mkdtemp folder is gone
    kept = json.loads((REPO / "bench" / "results" / "shard" / "results.json").read_text())
    assert [lab["hosts"] for lab in json.loads((out / "results.json").read_text())["labs"]] == \
        [lab["hosts"] for lab in kept["labs"]]
    table = (out / "table.md").read_text()
    for lab in kept["labs"]:
        assert f"- {lab['hosts']} hosts capped at {lab['cap_mib']} MiB" in table
    assert (out / "shard.png").stat().st_size > 10_000
