"""`python -m ddplab settings [--write]`: the files derived from the spec, so they cannot drift from it.

- roles/ddplab/defaults/main.yml: the run-wide defaults (every play lists role ddplab first);
- inventory/example/group_vars/all/{ddplab,code}.yml: every setting, commented, as documentation.

Without --write it exits 1 and names each file that differs from what the spec produces.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from ddplab.settings.spec import CODE, HOST, RUN, SETTINGS, Setting

REPO = Path(__file__).resolve().parents[2]
STAMP = ("GENERATED from ddplab/settings/spec.py by `python -m ddplab settings --write`: edit the spec, "
         "not this file.")


def yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value)  # JSON strings, lists and mappings are YAML flow values


def comment(text: str, width: int = 108) -> list[str]:
    return textwrap.wrap(text, width=width, initial_indent="# ", subsequent_indent="# ",
                         break_on_hyphens=False, break_long_words=False)


def _range(s: Setting) -> str:
    if s.kind != "int":
        return ""
    if s.min is not None and s.max is not None:
        return f" ({s.min}..{s.max})"
    return f" (>= {s.min})" if s.min is not None else ""


def defaults_yml() -> str:
    intro = ("Run-wide ddplab settings: the defaults of the whole tool (every play lists this role first). "
             "Set them in inventory/<name>/group_vars/all/*.yml, per host, or with -e; `python -m ddplab "
             "validate` checks them before a node is touched.")
    lines = ["---", *comment(intro), *comment(STAMP)]
    for s in SETTINGS:
        if s.section == HOST:
            continue
        lines += ["", *comment(s.doc + _range(s)), f"{s.name}: {yaml_value(s.default)}"]
    return "\n".join(lines) + "\n"


def example_yml(section: str, intro: str) -> str:
    lines = ["---", *comment(intro), *comment(STAMP)]
    for s in SETTINGS:
        if s.section != section:
            continue
        shown = s.default if s.example is None else s.example
        doc = s.doc + _range(s) + ("" if s.example is None else f" Default: {yaml_value(s.default)}.")
        lines += ["", *comment(doc), f"# {s.name}: {yaml_value(shown)}"]
    return "\n".join(lines) + "\n"


def outputs() -> dict[Path, str]:
    example = REPO / "inventory" / "example" / "group_vars" / "all"
    return {
        REPO / "roles" / "ddplab" / "defaults" / "main.yml": defaults_yml(),
        example / "ddplab.yml": example_yml(RUN, "Run-wide settings, every one optional; the value shown is "
                                            "the default (or an example when the comment names the "
                                            "default). Override any of them for one command with -e "
                                            "NAME=VALUE."),
        example / "code.yml": example_yml(CODE, "Bring your own training code (docs/your-code.md). "
                                          "All optional: unset, ddplab runs its built-in "
                                          "trainer; the value shown is an example. Any of these may also be "
                                          "set per group or per host (group_vars/, host_vars/)."),
    }


def run(args) -> int:
    stale = []
    for path, text in outputs().items():
        if path.exists() and path.read_text() == text:
            continue
        if args.write:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
        else:
            stale.append(str(path.relative_to(REPO)))
    for path in stale:
        print(f"ddplab: error: {path} (all): differs from ddplab/settings/spec.py; the generated text; "
              "run python -m ddplab settings --write")
    return 1 if stale else 0


def add_parser(sub) -> None:
    p = sub.add_parser("settings", help="write (or check) the files generated from the settings spec",
                       description=__doc__)
    p.add_argument("--write", action="store_true", help="rewrite the generated files")
    p.set_defaults(func=run)
