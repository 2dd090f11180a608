"""``ddplab_launch_command``: torchrun's command line for a launch (ddplab/launch_command.py), as one dict.

    launch_command: "{{ lookup('ddplab_launch_command', pythonpath=ddplab_lab.pythonpath,
      data=ddplab_lab.data, run_dir=ddplab_run_dir, run_id=ddplab_run, resume=launch_resume_run) }}"

The settings it reads (ddplab.launch_command.SETTINGS) come from the task's variables, so no play or role
lists them again.
"""

from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.launch_command import SETTINGS, launch_command

DOCUMENTATION = """
name: ddplab_launch_command
short_description: torchrun's command line for a launch, from ddplab's settings
options:
  pythonpath: {description: "The node's code folder the ranks import (scripts are in it).", required: true}
  data: {description: The node's shard folder (--data)., required: true}
  run_dir: {description: The run's folder on the node (--out is its out/)., required: true}
  run_id: {description: The run's id (--run-id)., required: true}
  resume: {description: Whether this launch resumes (--resume)., type: bool, default: false}
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        settings = {}
        for name in SETTINGS:
            if name not in (variables or {}):
                raise AnsibleLookupError(f"ddplab_launch_command: {name} is not defined (list role ddplab "
                                         "in the play: it holds every setting's default)")
            settings[name] = self._templar.template(variables[name])
        return [launch_command(settings, *(str(self.get_option(o)) for o in ("pythonpath", "data", "run_dir",
                                                                            "run_id")),
                               self.get_option("resume"))]
