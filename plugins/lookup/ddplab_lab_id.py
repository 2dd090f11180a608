"""``ddplab_lab_id``: what tells this lab apart from another (ddplab/lab_tag.py), from the inventory alone (no
SSH), on the control host.

    "{{ lookup('ddplab_lab_id', 'tag') }}"          -> "3f9a1c2b"
    "{{ lookup('ddplab_lab_id', 'slurm_job') }}"    -> "ddplab-3f9a1c2b-" (the lab's Slurm job names)
    "{{ lookup('ddplab_lab_id', 'secrets_dir') }}"  -> ddplab_secrets_dir, or ~/.config/ddplab/3f9a1c2b
    "{{ lookup('ddplab_lab_id', 'rule_comment') }}" -> "ddplab-lab-3f9a1c2b" (the lab's firewall rules)
    "{{ lookup('ddplab_lab_id', 'retired_rule_comment', root=ddplab_lab.root) }}"
                                       -> the form before it, on the node whose lab folder is root

The master is the first host of ``ddplab_master``; its address is ``ddplab_addr``, else ``ansible_host``,
else its inventory name (as roles/lab_facts), its folder ``ddplab_root`` (the spec's default where the
inventory leaves it out).
"""

from __future__ import annotations

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.lab_tag import lab_tag, retired_rule_comment, rule_comment, secrets_dir, slurm_job_prefix
from ddplab.settings.spec import BY_NAME

DOCUMENTATION = """
name: ddplab_lab_id
short_description: The lab's tag, its Slurm job name prefix, or its folder of control-side secrets
options: {}
"""

WHAT = ("tag", "slurm_job", "secrets_dir", "rule_comment", "retired_rule_comment")


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        variables = variables or {}
        what = terms[0] if terms else "tag"
        if what not in WHAT:
            raise AnsibleLookupError(f"ddplab_lab_id: {what!r} is not one of {', '.join(WHAT)}")
        try:
            master = variables["groups"]["ddplab_master"][0]
            hv = variables["hostvars"][master]
        except (KeyError, IndexError) as e:
            raise AnsibleLookupError("ddplab_lab_id: the inventory has no ddplab_master host") from e
        template = self._templar.template
        addr = template(hv.get("ddplab_addr") or hv.get("ansible_host") or master)
        root = template(hv.get("ddplab_root", BY_NAME["ddplab_root"].default))
        tag = lab_tag(str(addr), str(root))
        if what == "tag":
            return [tag]
        if what == "slurm_job":
            return [slurm_job_prefix(tag)]
        if what == "rule_comment":
            return [rule_comment(tag)]
        if what == "retired_rule_comment":
            return [retired_rule_comment(str(addr), str(kwargs["root"]))]
        given = template(variables.get("ddplab_secrets_dir", ""))
        return [secrets_dir(str(given or ""), tag, os.path.expanduser("~"))]
