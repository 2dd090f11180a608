"""The boundary between the node programs that run alone and the rest of nodeprobe (nodeprobe/__init__.py).

Each module in nodeprobe.SHIPPED_ALONE is run as roles run it, first on stdin of `python -I -c BOOT`,
here also with `-S` (no site-packages at all) from a folder holding a `json.py` that would break it if the
working folder reached sys.path: it must import with the standard library alone. ddplab/node_command.py
(the one way roles run node code, through ddplab_node's `nodeprobe:`) ships exactly these modules alone and
runs any other verb from the synced code.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddplab.node_command import NodeCommandError, lab_folders, nodeprobe_command, shipped_alone
from nodeprobe import SHIPPED_ALONE

REPO = Path(__file__).resolve().parents[2]


# Run the module's top level (its imports and definitions) without its `if __name__ == "__main__":` part.
TOP_LEVEL = ("import sys; src = sys.stdin.read(); "
             "exec(compile(src, 'shipped', 'exec'), {'__name__': 'shipped'}); print('ok')")


@pytest.mark.parametrize("name", SHIPPED_ALONE)
def test_each_runs_with_the_standard_library_alone(name, tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('the working folder reached sys.path')\n")
    argv, served = nodeprobe_command(name.replace("_", "-"), ["--x"], "python3")
    source = (REPO / "nodeprobe" / f"{name}.py").read_text()
    assert argv[:3] == ["python3", "-I", "-c"] and argv[4:] == [str(len(source)), "--x"] and served == source
    assert source.isascii()  # BOOT counts characters: the same count in any node's locale
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", TOP_LEVEL], input=source, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == set(), name


def test_a_verb_of_the_synced_code_is_never_shipped_alone():
    with pytest.raises(NodeCommandError, match="python is for a verb shipped alone, not fingerprint"):
        nodeprobe_command("fingerprint", [], "python3", python="/usr/bin/python3")
    argv, program = nodeprobe_command("fingerprint", [], "python3", lab=lab_folders("/l"))
    assert program is None and argv[:2] == ["/bin/sh", "-c"]
    assert argv[4:7] == ["python3", "/l/code", "fingerprint"]


def test_roles_run_node_code_only_through_ddplab_node():
    """No role reads a nodeprobe file by climbing out of the roles tree, names an interpreter for node code or
    runs `-m nodeprobe` itself; every module shipped alone is used by a role's `nodeprobe:` verb."""
    climbs = [str(p.relative_to(REPO)) for p in (REPO / "roles").rglob("*.yml") if "/../" in p.read_text()]
    assert climbs == []
    texts = {p: p.read_text() for folder in ("roles", "playbooks") for p in (REPO / folder).rglob("*.yml")}
    own_way = [f"{p.relative_to(REPO)}: {line.strip()}"
               for p, text in texts.items() for line in text.splitlines()
               if re.search(r"-m\W+nodeprobe|\W-I\W(?!-m (?:pip|venv)\b)|ddplab_node_program", line)
               and "ansible_playbook_python" not in line]  # the control host's own `nodeprobe connect`
    # (`python -I -m pip` and `-I -m venv` are torch_env running Python's own tools, not node code)
    assert own_way == []
    # the interpreter node code runs with is chosen in ddplab/node_command.py; torch_env's candidates for the
    # venv's base Python are what it examines, not how node code runs
    chooses = [str(p.relative_to(REPO)) for p in (REPO / "roles").rglob("*.yml")
               if "ansible_python_interpreter" in p.read_text()]
    assert chooses == ["roles/torch_env/defaults/main.yml"]
    verbs = {verb for text in texts.values()
             for verb in re.findall(r"nodeprobe: ([\w-]+)|'ddplab_node_argv', '([\w-]+)'", text)}
    shipped = {shipped_alone(verb) for pair in verbs for verb in pair if verb}
    # relay_receive is a file that relay_access places (roles/relay_ssh/vars), the forced command of a key
    assert (shipped - {None}) | {"relay_receive"} == set(SHIPPED_ALONE)

