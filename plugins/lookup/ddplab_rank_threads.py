"""``ddplab_rank_threads``: this node's torch threads per rank (ddplab/rank_threads.py).

    launch_rank_threads: "{{ query('ddplab_rank_threads') | first }}"

Reads ``ddplab_threads``, and for 0 every play host's ``ddplab_nproc_per_node`` (the spec's default where the
inventory and -e leave it out) and launch facts
(``launch_node``: its CPU set and boot id), so hosts that share a machine share its CPUs.
"""

from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.rank_threads import rank_threads
from ddplab.settings.spec import BY_NAME

RANKS = "ddplab_nproc_per_node"

DOCUMENTATION = """
name: ddplab_rank_threads
short_description: Torch threads per rank of this node, CPUs shared with the hosts of the same machine
options: {}
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        template = self._templar.template
        try:
            me, hostvars = variables["inventory_hostname"], variables["hostvars"]
            threads = int(template(variables["ddplab_threads"]))
            nodes = {}
            for host in variables["ansible_play_hosts"]:
                facts = hostvars[host].get("launch_node")
                # another host's variables hold no role defaults: the spec's default stands in for them
                ranks = variables[RANKS] if host == me else hostvars[host].get(RANKS, BY_NAME[RANKS].default)
                if facts:
                    nodes[host] = {"ranks": int(template(ranks)), "cpus": facts.get("cpus") or [],
                                   "machine": facts.get("machine") or ""}
        except KeyError as e:
            raise AnsibleLookupError(f"ddplab_rank_threads: {e} is not defined (run it after the launch "
                                     "facts, in a play that lists role ddplab)") from e
        return [rank_threads(me, nodes, threads)]
