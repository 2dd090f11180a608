"""nodeprobe/site_probe.py, shipped alone on stdin as roles/torch_env runs it (`python -I -`)."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).resolve().parents[2] / "nodeprobe" / "site_probe.py"


def test_it_reports_platform_sites_and_what_the_python_has_installed():
    out = subprocess.run([sys.executable, "-I", "-"], input=PROBE.read_text(), capture_output=True, text=True,
                         timeout=60, check=True, cwd="/")
    found = json.loads(out.stdout)
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert found["platform"].split()[:2] == [version, platform.machine()]
    assert found["purelib"] in found["sites"]
    installed = dict(found["installed"])
    assert installed["packaging"] and installed["pyyaml"]  # canonical names, as pip compares them
