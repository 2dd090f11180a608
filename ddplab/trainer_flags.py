"""The built-in trainer's command line for a launch, from ddplab's settings.

One home for which setting sets which trainer flag; the flags themselves are the trainer's own
(trainer.cli.command_line spells them from TrainConfig's fields). ddplab/launch_command.py builds a launch's
whole command line with them (roles/launch, `python -m ddplab export sbatch`); the settings check uses them
directly.
"""

from __future__ import annotations

from trainer.cli import command_line, flag_of

# ddplab setting -> the trainer's field it sets, in the order of the command line; --resume (decided by the
# launch role per run, from ddplab_resume and the run's checkpoints) goes between the two groups
VALUE_FIELD = {"ddplab_trainer_steps": "steps", "ddplab_trainer_depth": "depth",
               "ddplab_pg_timeout": "pg_timeout_s"}
SWITCH_FIELD = {"ddplab_balance": "balance", "ddplab_elastic": "elastic", "ddplab_shard": "shard"}
SETTING_FIELD = {**VALUE_FIELD, **SWITCH_FIELD}
EXTRA_ARGS = "ddplab_trainer_extra_args"  # appended as given: the user's own trainer flags
# the setting behind each flag ddplab passes (to name it when the trainer refuses a value)
FLAG_SETTING = {**{flag_of(field): name for name, field in SETTING_FIELD.items()},
                "--run-id": "ddplab_run_id", "--threads": "ddplab_threads"}
TRUE_WORDS = ("yes", "on", "1", "true", "y", "t")  # Ansible's booleans (-e k=v gives strings)


def switch(value) -> bool:
    return value.strip().lower() in TRUE_WORDS if isinstance(value, str) else bool(value)


def launch_flags(settings: dict, data: str, out: str, run_id: str, resume=False) -> list[str]:
    """The trainer's flags for one launch: the run's folders and id, the settings of SETTING_FIELD (as
    Ansible gives them: numbers and switches may be strings), --resume when the launch resumes, then
    ddplab_trainer_extra_args. The thread count is added by launch.sh (the node resolves it)."""
    values = {"data": data, "out": out, "run_id": run_id,
              **{field: int(settings[name]) for name, field in VALUE_FIELD.items()},
              "resume": switch(resume),
              **{field: switch(settings[name]) for name, field in SWITCH_FIELD.items()}}
    return command_line(values) + [str(a) for a in settings[EXTRA_ARGS]]
