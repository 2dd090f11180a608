"""`python -m ddplab validate` as the role runs it: JSON on stdin, lines on stderr, exit 2, no traceback."""

import json
import subprocess
import sys

from settings_helpers import REPO, inventory, shards  # noqa: F401


def validate(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddplab", "validate", "--offline"], input=text, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_healthy_is_silent(shards):  # noqa: F811
    proc = validate(json.dumps(inventory(shards)))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


def test_bad_settings_one_line_each(shards):  # noqa: F811
    proc = validate(json.dumps(inventory(shards, ddplab_trainer_steps="-5", ddplab_wait="maybe")))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [ln.split(" (")[0] for ln in proc.stderr.splitlines()] == ["ddplab: error: ddplab_trainer_steps",
                                                                      "ddplab: error: ddplab_wait"]


def test_warning_only_exits_zero(shards):  # noqa: F811
    proc = validate(json.dumps(inventory(shards, ddplab_strict=False, ddplab_trainer_stpes=1)))
    assert proc.returncode == 0 and proc.stderr.startswith("ddplab: warning: ddplab_trainer_stpes (all)")


def test_input_that_is_not_json():
    proc = validate("{nope")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("ddplab: error: validate input (-): ")
