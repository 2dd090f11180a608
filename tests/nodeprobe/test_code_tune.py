"""nodeprobe code-tune (ddplab tune's 1-node layouts): the built-in trainer as 1 and 2 real local ranks over
loopback gloo, timed from the progress line rank 0 prints; the scratch copy is gone afterwards."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers.playbooks import make_shards

REPO = Path(__file__).resolve().parents[2]


def tune(spec: dict) -> dict:
    proc = subprocess.run([sys.executable, "-m", "nodeprobe", "code-tune"], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=300, cwd=REPO, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_trainer_as_one_and_two_local_ranks_reads_its_tokens_per_second(tmp_path):
    code = tmp_path / "code"
    shutil.copytree(REPO / "trainer", code / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    shards = make_shards(tmp_path / "shards")
    results = {}
    for world in (1, 2):
        run = tmp_path / f"run{world}"
        spec = {"python": sys.executable, "src": str(code), "scratch": str(run / "tune"),
                "entrypoint": "-m trainer",
                "args": ["--data", str(shards), "--out", str(run / "out"), "--steps", "5", "--depth", "1",
                         "--seq-len", "32", "--batch-size", "2"],
                "world": world, "threads": 1, "seconds": 240, "out": str(run / f"1x{world}.log")}
        results[world] = tune(spec)
        assert not (run / "tune").exists()  # the scratch copy is removed
        assert "step" in (run / f"1x{world}.log").read_text()
    for world, got in results.items():
        assert got["world"] == world and got["format"] == "ddplab", got
        assert got["note"] == "ran to its end" and not got["timed_out"]
        steps = [r["step"] for r in got["records"]]
        assert steps and steps[-1] == 5, got["records"]
        assert all(r["tokens_per_sec"] > 0 for r in got["records"])
    # two ranks all-reduce every step; one rank has nothing to wait for
    assert all(r["allreduce_ms"] > 0 for r in results[2]["records"])


def test_a_rank_that_fails_is_the_note(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "boom.py").write_text("import sys\nprint('step 1 boom')\nsys.exit(3)\n")
    got = tune({"python": sys.executable, "src": str(code), "scratch": str(tmp_path / "run" / "tune"),
                "entrypoint": "boom.py", "world": 1, "seconds": 60,
                "log_pattern": r"^step (?P<step>\d+)"})
    assert got["note"].startswith("a rank exited with code 3"), got
    assert got["format"] == "custom" and got["records"] == [{"step": 1}]
