"""``ddplab_trainer_flags``: the built-in trainer's command line for a launch (ddplab/trainer_flags.py).

    launch_args: "{{ query('ddplab_trainer_flags', data=ddplab_lab.data, out=ddplab_run_dir ~ '/out',
                           run_id=ddplab_run, resume=launch_resume_run | default(false)) }}"

The settings it reads (ddplab.trainer_flags.SETTING_FIELD and ddplab_trainer_extra_args) come from the
task's variables, so no play or role lists them again.
"""

from __future__ import annotations

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase

from ddplab.trainer_flags import EXTRA_ARGS, SETTING_FIELD, launch_flags

DOCUMENTATION = """
name: ddplab_trainer_flags
short_description: The built-in trainer's flags for a launch, from ddplab's settings
options:
  data: {description: The node's shard folder (--data)., required: true}
  out: {description: The rank's output folder (--out)., required: true}
  run_id: {description: The run's id (--run-id)., required: true}
  resume: {description: Whether this launch resumes (--resume)., type: bool, default: false}
"""


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        settings = {}
        for name in (*SETTING_FIELD, EXTRA_ARGS):
            if name not in (variables or {}):
                raise AnsibleLookupError(f"ddplab_trainer_flags: {name} is not defined (list role ddplab "
                                         "in the play: it holds every setting's default)")
            settings[name] = self._templar.template(variables[name])
        return launch_flags(settings, str(self.get_option("data")), str(self.get_option("out")),
                            str(self.get_option("run_id")), self.get_option("resume"))
