"""``ddplab_constant``: a constant whose one home is ddplab's Python, for a role's defaults.

    torch_env_extra_index_url: "{{ lookup('ddplab_constant', 'torch_cpu_index') }}"

tests/test_one_home.py fails when a role, a template or another module spells one of them again.
"""

from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.settings.external import CPU_INDEX

DOCUMENTATION = """
name: ddplab_constant
short_description: A constant of ddplab's Python (its one home), by name
options:
  _terms: {description: "The constant's name: torch_cpu_index.", required: true}
"""

CONSTANTS = {"torch_cpu_index": CPU_INDEX}


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        unknown = [t for t in terms if t not in CONSTANTS]
        if unknown:
            raise AnsibleLookupError(f"ddplab_constant: no constant {', '.join(unknown)}; "
                                     f"known: {', '.join(CONSTANTS)}")
        return [CONSTANTS[t] for t in terms]
