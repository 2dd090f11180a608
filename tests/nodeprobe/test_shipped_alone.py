"""The boundary between the node programs that run alone and the rest of nodeprobe (nodeprobe/__init__.py).

Each module in nodeprobe.SHIPPED_ALONE is run as roles run it, the program on stdin of `python -I -`,
here also with `-S` (no site-packages at all) from a folder holding a `json.py` that would break it if the
working folder reached sys.path: it must import with the standard library alone. The lookup the roles use
serves exactly these modules and refuses any other by name.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nodeprobe import SHIPPED_ALONE

REPO = Path(__file__).resolve().parents[2]


def lookup(name: str) -> subprocess.CompletedProcess:
    """The lookup's program() in a process of its own: importing Ansible patches sys.intern, which torch's
    compiler then refuses in the test worker that imported it."""
    code = ("import sys; sys.path.insert(0, 'plugins/lookup'); import ddplab_node_program as m; "
            "sys.stdout.write(m.program(sys.argv[1]))")
    return subprocess.run([sys.executable, "-c", code, name], cwd=REPO, capture_output=True, text=True,
                          timeout=60)

# Run the module's top level (its imports and definitions) without its `if __name__ == "__main__":` part.
TOP_LEVEL = ("import sys; src = sys.stdin.read(); "
             "exec(compile(src, 'shipped', 'exec'), {'__name__': 'shipped'}); print('ok')")


@pytest.mark.parametrize("name", SHIPPED_ALONE)
def test_each_runs_with_the_standard_library_alone(name, tmp_path):
    (tmp_path / "json.py").write_text("raise SystemExit('the working folder reached sys.path')\n")
    served = lookup(name)
    source = (REPO / "nodeprobe" / f"{name}.py").read_text()
    assert served.returncode == 0 and served.stdout == source, served.stderr
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", TOP_LEVEL], input=source, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module and node.level == 0}
    assert imported - set(sys.stdlib_module_names) - {"__future__"} == set(), name


def test_the_lookup_refuses_a_module_that_is_not_shipped_alone():
    refused = lookup("fingerprint")
    assert refused.returncode != 0 and "AnsibleLookupError" in refused.stderr
    said = re.search(r"'fingerprint' is not shipped alone .* allowed: prereqs", refused.stderr)
    assert said, refused.stderr


def test_roles_ship_node_code_only_through_the_lookup():
    """No role reads a nodeprobe file by climbing out of the roles tree."""
    climbs = [str(p.relative_to(REPO)) for p in (REPO / "roles").rglob("*.yml") if "/../" in p.read_text()]
    assert climbs == []
    shipped = {name for p in (REPO / "roles").rglob("*.yml")
               for name in re.findall(r"lookup\('ddplab_node_program', '(\w+)'\)", p.read_text())}
    # relay_take goes with the relay job itself (ddplab/relay.py TAKE_PROGRAM), not with a role
    assert shipped | {"relay_take"} == set(SHIPPED_ALONE)
    assert 'with_name("relay_take.py")' in (REPO / "ddplab" / "relay.py").read_text()
