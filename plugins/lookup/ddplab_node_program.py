"""``ddplab_node_program``: the source of a node program that runs alone (nodeprobe.SHIPPED_ALONE).

    stdin: "{{ lookup('ddplab_node_program', 'procs') }}"

Roles hand it to ``python -I -`` on the node before the synced code exists. One home for the boundary:
only the modules ``nodeprobe.SHIPPED_ALONE`` names are served (those import the standard library only,
tests/nodeprobe/test_shipped_alone.py), so a role cannot ship a module that needs the rest of the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

DOCUMENTATION = """
name: ddplab_node_program
short_description: The source of a nodeprobe module that runs alone on a node (nodeprobe.SHIPPED_ALONE)
options:
  _terms: {description: The module's name, such as procs., required: true}
"""

NODEPROBE = Path(__file__).resolve().parents[2] / "nodeprobe"


def shipped_alone() -> tuple[str, ...]:
    """nodeprobe.SHIPPED_ALONE, read from the package's source (Ansible's interpreter need not import it)."""
    tree = ast.parse((NODEPROBE / "__init__.py").read_text())
    for node in tree.body:
        names = [getattr(t, "id", "") for t in getattr(node, "targets", [])]
        if isinstance(node, ast.Assign) and "SHIPPED_ALONE" in names:
            return tuple(ast.literal_eval(node.value))
    raise AnsibleLookupError(f"ddplab_node_program: no SHIPPED_ALONE in {NODEPROBE / '__init__.py'}")


def program(name: str) -> str:
    allowed = shipped_alone()
    if name not in allowed:
        raise AnsibleLookupError(f"ddplab_node_program: '{name}' is not shipped alone (it may import the "
                                 f"rest of nodeprobe); allowed: {', '.join(allowed)}; fix: run it as "
                                 f"`python -m nodeprobe` from the synced code, or add it to "
                                 f"nodeprobe.SHIPPED_ALONE once it imports the standard library only")
    return (NODEPROBE / f"{name}.py").read_text()


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        return [program(str(term)) for term in terms]
