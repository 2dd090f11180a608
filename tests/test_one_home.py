"""Each constant has one home: a second copy of the run-id form, the torch pin, the CPU wheel index, the
process-group timeout, the lab tag, anywhere in the code, roles, playbooks or inventories, or a setting's
default restated in a role or playbook, fails here (the files generated from the settings spec are copies by
construction, tests/settings/test_generated.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from ddplab.settings import generate
from ddplab.settings.external import CPU_INDEX
from ddplab.settings.spec import BY_NAME, HOST, SETTINGS
from trainer.launch_contract import PG_TIMEOUT_S, RUN_ID

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("ddplab", "nodeprobe", "trainer", "plugins", "roles", "playbooks", "inventory", "simlan", "bench")
SUFFIXES = {".py", ".yml", ".yaml", ".j2", ".sh", ".cfg", ".toml"}
GENERATED = {p.relative_to(REPO) for p in generate.outputs()}
PIN = BY_NAME["ddplab_torch_version"].default

# constant: (how a copy of it is spelled, its one home)
HOMES = {
    "run-id form": (re.escape(RUN_ID), "trainer/launch_contract.py"),
    "torch pin": (rf"""["']{re.escape(PIN)}["']|=={re.escape(PIN)}""", "ddplab/settings/spec.py"),
    "CPU wheel index": (re.escape(CPU_INDEX), "ddplab/settings/external.py"),
    "process-group timeout": (rf"(?i)pg_timeout\w*\s*(:\s*float\s*)?[:=]\s*(float\()?{PG_TIMEOUT_S}\b",
                              "trainer/launch_contract.py"),
    # the lab's identity (its Slurm jobs, secrets folder and firewall rules): one hash, one comment form
    "lab tag": (r"""def \w*lab_tag\b|["']ddplab-lab-(["']|\{)""", "ddplab/lab_tag.py"),
}


def files():
    for folder in SOURCES:
        for path in sorted((REPO / folder).rglob("*")):
            if path.suffix in SUFFIXES and path.is_file() and "__pycache__" not in path.parts:
                yield path.relative_to(REPO)
    yield Path("Makefile")
    yield Path("pyproject.toml")


TEXTS = {path: (REPO / path).read_text() for path in files()}


@pytest.mark.parametrize("name", HOMES)
def test_each_constant_is_spelled_in_its_home_only(name):
    pattern, home = HOMES[name]
    spelled = sorted(str(p) for p, text in TEXTS.items() if re.search(pattern, text) and p not in GENERATED)
    # pip reads the control host's own pin from pyproject.toml: a mirror, checked against the spec below
    assert spelled == sorted({home} | ({"pyproject.toml"} if name == "torch pin" else set())), spelled


def test_pyproject_pins_the_settings_torch():
    deps = tomllib.loads(TEXTS[Path("pyproject.toml")])["project"]["dependencies"]
    assert f"torch=={PIN}" in deps


def test_no_role_or_playbook_restates_a_settings_default():
    """Every play lists role ddplab (its defaults are the spec's): a role or playbook that writes
    `ddplab_x | default(...)` keeps a second default that drifts. Host settings have no run-wide default."""
    names = "|".join(s.name for s in SETTINGS if s.section != HOST)
    again = [f"{p}: {m.group(0)}" for p, text in TEXTS.items() if p.parts[0] in ("roles", "playbooks")
             for m in re.finditer(rf"(?<![.\w])({names})\s*\|\s*default\(", text)]
    assert again == []
