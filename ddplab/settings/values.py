"""Turn the raw value of one setting (as YAML or `-e` gave it) into its typed value, or say why not.

`-e name=value` always gives a string, so "50" is an integer and "true" a boolean; a string is never a
list (Ansible's own list type would split "a,b" on commas, and a loop would walk its characters).
"""

from __future__ import annotations

import json
import re

from ddplab.settings.problems import Problem
from ddplab.settings.spec import Setting

TRUE = {"true", "yes", "on", "y", "t", "1"}
FALSE = {"false", "no", "off", "n", "f", "0"}
INT = re.compile(r"[+-]?\d+")


def shown(value) -> str:
    """A value as the user would recognise it, with its type when that is the point."""
    text = json.dumps(value, default=str)
    if isinstance(value, str):
        return f"{text} (a string)" if value else "\"\" (an empty string)"
    if isinstance(value, dict):
        return f"{text} (a mapping)"
    if isinstance(value, bool):
        return f"{text} (a boolean)"
    if value is None:
        return "nothing (null)"
    return text


def _fix(s: Setting, value) -> str:
    if s.kind == "list" and s.elements == "dict":
        return (f"write it as a list of mappings: {s.name}: [{{src: /path/on/control, dest: data/name}}] in "
                f"group_vars, or -e '{{\"{s.name}\": [{{\"src\": ..., \"dest\": ...}}]}}'")
    if s.kind == "list":
        items = [value] if isinstance(value, str) and value else ["..."]
        return (f"write it as a list: -e '{json.dumps({s.name: items})}' or {s.name}: {json.dumps(items)} "
                f"in group_vars")
    if s.kind == "dict":
        return (f"write it as a mapping: {s.name}: {{NAME: value}} in group_vars, "
                f"or -e '{{\"{s.name}\": {{...}}}}'")
    if s.section == "host":
        return f"set {s.name} on each host in the inventory"
    default = s.default if s.default is not None and not s.jinja else None
    example = f" (default: {json.dumps(default)})" if default is not None else ""
    return f"set {s.name} in group_vars/all/ or with -e {s.name}=VALUE{example}"


def _scalar(value) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def coerce(s: Setting, value) -> tuple[object, Problem | None]:
    """(typed value, None) or (None, the problem)."""

    def bad(allowed=None):
        return None, Problem(s.name, shown(value), allowed or s.allowed(), _fix(s, value))

    if s.kind == "int":
        if isinstance(value, bool):
            return bad()
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, str) and INT.fullmatch(value.strip()):
            value = int(value.strip())
        if not isinstance(value, int):
            return bad()
        if (s.min is not None and value < s.min) or (s.max is not None and value > s.max):
            return bad()
        return value, None
    if s.kind == "bool":
        if isinstance(value, bool):
            return value, None
        if isinstance(value, int) and value in (0, 1):
            return bool(value), None
        if isinstance(value, str) and value.strip().lower() in TRUE | FALSE:
            return value.strip().lower() in TRUE, None
        return bad()
    if s.kind == "str":
        if value is None:  # `name:` with nothing after it in YAML
            value = ""
        if not _scalar(value):
            return bad()
        value = str(value)
        if s.choices and value not in s.choices:
            return bad()
        if value and s.pattern and not re.fullmatch(s.pattern, value):
            return bad()
        return value, None
    if s.kind == "list" and s.elements == "dict":
        if not isinstance(value, list) or not all(isinstance(v, dict) and set(v) == {"src", "dest"}
                                                  and all(_scalar(x) and str(x) for x in v.values())
                                                  for v in value):
            return bad()
        return [{"src": str(v["src"]), "dest": str(v["dest"])} for v in value], None
    if s.kind == "list":
        if not isinstance(value, list) or not all(_scalar(v) for v in value):
            return bad()
        return [str(v) for v in value], None
    if s.kind == "dict":
        if not isinstance(value, dict) or not all(_scalar(v) for v in value.values()):
            return bad()
        return {str(k): str(v) for k, v in value.items()}, None
    raise ValueError(f"unknown kind {s.kind} of {s.name}")
