"""Render the launch role's real templates (launch.sh.j2, trainer.env.j2, rank_python.sh.j2) for one node,
without Ansible: for the tests and benches that run a node's launch files by hand.

The variables are what a play gives the launch role: the ddplab role's defaults, the launch role's
defaults and vars (read from roles/*/{defaults,vars}/main.yml and resolved lazily, as Ansible does), the facts
that tasks set (`facts`, given explicitly by the caller). Undefined variables fail loudly (StrictUndefined),
so a renamed variable breaks the caller instead of rendering an empty string. The few Ansible filters the
templates and defaults use are re-implemented here with Ansible's meaning.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import warnings
from collections.abc import Mapping
from pathlib import Path

import jinja2
import yaml
from jinja2.nativetypes import NativeEnvironment

REPO = Path(__file__).resolve().parents[1]
ROLES = REPO / "roles"
TEMPLATES = ("launch.sh.j2", "trainer.env.j2", "rank_python.sh.j2")


def _bool(value) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("yes", "on", "1", "true", "y", "t")
    return bool(value)


def _setup(env: jinja2.Environment) -> jinja2.Environment:
    env.filters.update(
        quote=lambda v: shlex.quote(str(v)),
        regex_replace=lambda v, pattern, repl="": re.sub(pattern, repl, str(v)),
        bool=_bool,
        combine=lambda *dicts: {k: v for d in dicts for k, v in d.items()},
        to_json=json.dumps,
        from_json=json.loads,
        dirname=os.path.dirname,
        basename=os.path.basename,
    )
    env.tests["match"] = lambda v, pattern: re.match(pattern, str(v)) is not None
    return env


@jinja2.pass_context
def _lookup(ctx, name: str, **kwargs):
    """Ansible's lookup() for the one lookup the launch role uses (plugins/lookup/ddplab_launch_command.py),
    with the same function behind it."""
    from ddplab.launch_command import SETTINGS, launch_command

    assert name == "ddplab_launch_command", f"lookup({name!r}) is not rendered without Ansible"
    settings = {n: ctx.resolve(n) for n in SETTINGS}
    return launch_command(settings, kwargs["pythonpath"], kwargs["data"], kwargs["run_dir"], kwargs["run_id"],
                          kwargs.get("resume", False))


class _Vars(Mapping):
    """Play variables whose string values are templates, rendered (natively) on first use."""

    def __init__(self, raw: dict):
        self.raw, self.done = raw, {}
        self.env = _setup(NativeEnvironment(undefined=jinja2.StrictUndefined))

    def __getitem__(self, key):
        if key == "lookup":  # templates are rendered with the play's variables only (shared context)
            return _lookup
        if key not in self.done:
            self.done[key] = self._resolve(self.raw[key])
        return self.done[key]

    def __iter__(self):
        return iter(self.raw)

    def __len__(self):
        return len(self.raw)

    def _resolve(self, value):
        if isinstance(value, str) and ("{{" in value or "{%" in value):
            with warnings.catch_warnings():  # jinja2 decodes '\\s' in a string literal with a warning
                warnings.simplefilter("ignore", DeprecationWarning)
                template = self.env.from_string(value)
            ctx = template.new_context(self, shared=True)
            return self.env.concat(template.root_render_func(ctx))
        if isinstance(value, list):
            return [self._resolve(v) for v in value]
        if isinstance(value, dict):
            return {k: self._resolve(v) for k, v in value.items()}
        return value


def role_defaults(role: str) -> dict:
    return yaml.safe_load((ROLES / role / "defaults" / "main.yml").read_text()) or {}


def role_vars(role: str) -> dict:
    path = ROLES / role / "vars" / "main.yml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def render_launch(facts: dict, *, inventory_hostname: str = "node0") -> dict[str, str]:
    """{template name without .j2: rendered text} for one node; `facts` also override any default."""
    play = {"playbook_dir": str(REPO / "playbooks"), "inventory_hostname": inventory_hostname,
            "ansible_managed": "Ansible managed (rendered by ddplab/launch_render.py)"}
    variables = _Vars(play | role_defaults("ddplab") | role_defaults("launch") | role_vars("launch") | facts)
    env = _setup(jinja2.Environment(loader=jinja2.FileSystemLoader(ROLES / "launch" / "templates"),
                                    undefined=jinja2.StrictUndefined, trim_blocks=True,
                                    keep_trailing_newline=True))
    out = {}
    for name in TEMPLATES:
        template = env.get_template(name)
        out[name.removesuffix(".j2")] = "".join(template.root_render_func(template.new_context(variables,
                                                                                                shared=True)))
    return out
