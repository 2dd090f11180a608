"""How a node runs ddplab's node code: the one place that chooses the interpreter and the code folder.

plugins/action/ddplab_node.py (``nodeprobe: VERB``) and ddplab_wait.py run what ``host_command`` returns over
the task's connection, and ddplab/relay.py runs it over its own SSH connection (the argv from the
ddplab_node_argv lookup); no role names a Python or a code folder for node code (nodeprobe/__init__.py):

- a module of ``nodeprobe.SHIPPED_ALONE`` (the verb ``lab-dirs`` is lab_dirs.py): its source is the first
  characters of stdin (its input, if any, follows), run by ``PYTHON -I -c BOOT LENGTH`` (no synced code
  needed); PYTHON is Ansible's interpreter for the node, or ``python``, the interpreter the probe examines
  (site-probe, prereqs);
- any other verb: ``python -m nodeprobe VERB`` in the lab's code folder, with Ansible's interpreter, or for a
  verb of ``nodeprobe.PINNED_PYTHON`` (torch) the Python the lab's record names (torch_env writes it). A node
  without them answers exit 3 and one line "ddplab: error: this node is not prepared: WHAT; fix: run
  playbooks/prepare.yml" (preflight's verdict names the host, ddplab/preflight/judge.py fold_unprepared).
"""

from __future__ import annotations

from pathlib import Path

import nodeprobe
from nodeprobe import PINNED_PYTHON, SHIPPED_ALONE

NODEPROBE = Path(nodeprobe.__file__).resolve().parent
# Ansible's interpreter for a node whose inventory names none (node code runs without Ansible's discovery).
DEFAULT_INTERPRETER = "python3"
# A shipped module's runner: python runs the first LENGTH characters of stdin (the module's source, ASCII:
# the same count in any node's locale), which read the rest of stdin as their input.
BOOT = "import sys; exec(compile(sys.stdin.read(int(sys.argv.pop(1))), {name!r}, 'exec'))"

# The synced code's verbs: a fixed program, its values as positional arguments (nothing is quoted into it).
# $1: the interpreter, or @FILE naming it (the lab's record); $2: the code folder. A leading ~ is the node's
# home (the lab folder of a node left out by --limit comes unresolved from the inventory).
SYNCED = r"""py=$1 c=$2; shift 2; fix="fix: run playbooks/prepare.yml"
case $c in "~"/*) c=$HOME${c#"~"};; esac
case $py in @*) f=${py#@}; case $f in "~"/*) f=$HOME${f#"~"};; esac
  py=$(cat "$f" 2>/dev/null) && [ -x "$py" ] ||
  { v=$(python3 -c 'import platform, sys; print("%d.%d" % sys.version_info[:2], platform.machine())' \
      2>/dev/null)
    echo "ddplab: error: this node is not prepared: $f names no Python${v:+ (its python3: $v)}; $fix" >&2
    exit 3; };;
esac
cd "$c" 2>/dev/null && [ -d nodeprobe ] ||
{ echo "ddplab: error: this node is not prepared: no $c/nodeprobe; $fix" >&2; exit 3; }
PYTHONPATH=. PYTHONDONTWRITEBYTECODE=1 exec "$py" -m nodeprobe "$@"
"""


class NodeCommandError(ValueError):
    """A role asked for node code in a way that cannot run (the message names the fix)."""


def lab_folders(root: str) -> dict:
    """The code folder and Python record of the lab folder `root`, as roles/lab_facts names them."""
    root = root.rstrip("/") or "/"
    return {"code": f"{root}/code", "python_file": f"{root}/python"}


def shipped_alone(verb: str) -> str | None:
    """The module a verb runs alone (``lab-dirs`` -> ``lab_dirs``), or None for a verb of the synced code."""
    module = verb.replace("-", "_")
    return module if module in SHIPPED_ALONE else None


def shipped_program(verb: str) -> str:
    """The source of a verb shipped alone: the first characters of its stdin."""
    return (NODEPROBE / f"{shipped_alone(verb)}.py").read_text()


def nodeprobe_command(verb: str, args: list[str], interpreter: str, python: str | None = None,
                      lab: dict | None = None) -> tuple[list[str], str | None]:
    """(argv, the program that starts its stdin, or None) that runs `verb` with `args` on the node.
    `interpreter` is Ansible's for the node; `lab` holds ``code`` and ``python_file`` (roles/lab_facts'
    ddplab_lab)."""
    module = shipped_alone(verb)
    if module:
        program = shipped_program(verb)
        boot = BOOT.format(name=module)
        return [python or interpreter, "-I", "-c", boot, str(len(program)), *args], program
    if python:
        raise NodeCommandError(f"python is for a verb shipped alone, not {verb} (its Python is chosen here: "
                               f"nodeprobe.PINNED_PYTHON)")
    if not lab or not lab.get("code") or not lab.get("python_file"):
        raise NodeCommandError(f"nodeprobe {verb} needs the lab's folders (ddplab_lab, set by the lab_facts "
                               f"role); fix: list lab_facts before this role, or pass lab")
    python_choice = f"@{lab['python_file']}" if verb in PINNED_PYTHON else interpreter
    return ["/bin/sh", "-c", SYNCED, "nodeprobe", python_choice, lab["code"], verb, *args], None


def host_command(verb: str, args: list[str], template, python: str | None = None,
                 lab: str | None = None) -> tuple[list[str], str | None]:
    """`nodeprobe_command` for the host whose variables `template(name)` renders (None when unset): its
    ``ansible_python_interpreter`` and ``ddplab_lab``, or the lab folder `lab` (a node left out by
    --limit)."""
    interpreter = template("ansible_python_interpreter") or DEFAULT_INTERPRETER
    folders = lab_folders(lab) if lab else template("ddplab_lab")
    return nodeprobe_command(verb, args, str(interpreter), python, folders)
