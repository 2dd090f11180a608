"""``ddplab_node_argv``: the command that runs a nodeprobe verb on this host, as
``ddplab_node: {nodeprobe: VERB}`` would run it (ddplab/node_command.py chooses the interpreter and the code
folder), for a control-side step that reaches the node over its own SSH connection (ddplab/relay.py's
``relay-take`` after each hop).

    take: "{{ query('ddplab_node_argv', 'relay-take') }}"   -> ["python3", "-I", "-c", "...", "6043"]

A verb shipped alone reads its program first on stdin (ddplab.node_command.shipped_program), its input after.
"""

from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.node_command import NodeCommandError, host_command

DOCUMENTATION = """
name: ddplab_node_argv
short_description: The argv that runs a nodeprobe verb on this host, as ddplab_node would
options: {}
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        if len(terms) != 1:
            raise AnsibleLookupError("ddplab_node_argv: give one nodeprobe verb")
        try:
            argv, _ = host_command(terms[0], [], lambda name: self._templar.template(variables.get(name)))
        except NodeCommandError as e:
            raise AnsibleLookupError(f"ddplab_node_argv: {e}") from None
        return [str(a) for a in argv]
