"""The files generated from the spec are exactly what it produces, and every ddplab_* name in use is in it."""

import re

import yaml
from settings_helpers import REPO

from ddplab.settings import generate
from ddplab.settings.spec import BY_NAME, HOST, INTERNAL, SETTINGS


def test_generated_files_match_the_spec():
    stale = [str(p.relative_to(REPO)) for p, text in generate.outputs().items() if p.read_text() != text]
    assert stale == [], f"regenerate with `python -m ddplab settings --write`: {stale}"


def test_defaults_file_holds_the_spec_defaults():
    defaults = yaml.safe_load((REPO / "roles/ddplab/defaults/main.yml").read_text())
    assert defaults == {s.name: s.default for s in SETTINGS if s.section != HOST}


def test_example_inventory_documents_every_run_setting():
    folder = REPO / "inventory/example/group_vars/all"
    text = "".join((folder / f).read_text() for f in ("ddplab.yml", "code.yml"))
    documented = set(re.findall(r"^# (ddplab_\w+):", text, re.M))
    assert documented == {s.name for s in SETTINGS if s.section != HOST}


def test_every_name_the_roles_use_is_known():
    """A ddplab_* variable read anywhere in roles/, playbooks/ or inventory/ is a setting or a fact."""
    groups = {"ddplab_nodes", "ddplab_master", "ddplab_workers", "ddplab_gone"}
    plugins = {p.stem for p in (REPO / "plugins").rglob("ddplab_*.py")}  # lookup('ddplab_constant', ...)
    used = set()
    for folder in ("roles", "playbooks", "inventory"):
        for path in (REPO / folder).rglob("*"):
            if path.suffix in (".yml", ".yaml", ".j2") and path.is_file():
                used |= set(re.findall(r"\bddplab_[a-z0-9_]+", path.read_text()))
    assert used - set(BY_NAME) - INTERNAL - groups - plugins == set()
