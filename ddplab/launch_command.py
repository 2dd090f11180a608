"""torchrun's command line for a launch, built once for every way a run starts: roles/launch's launch.sh
(tmux, and the same file under Slurm) through plugins/lookup/ddplab_launch_command.py and `python -m ddplab
export sbatch` take it from ``launch_command`` (the settings check, ddplab/settings/external.py, checks the
trainer's part: ddplab/trainer_flags.py).

What torchrun runs is the built-in trainer (``-m trainer`` with the flags ddplab/trainer_flags.py builds) or,
with ddplab_code_dir, ``ddplab_entrypoint`` ("-m pkg.mod", or a script relative to the code folder) with
``ddplab_entrypoint_args`` as given. torchrun's own flags here are those of a run with a fixed node count; an
elastic run's rendezvous flags come from the node's environment (launch.sh).
"""

from __future__ import annotations

import re

from ddplab.trainer_flags import EXTRA_ARGS, SETTING_FIELD, launch_flags

# the settings launch_command reads (besides those of ddplab/trainer_flags.py)
SETTINGS = ("ddplab_code_dir", "ddplab_entrypoint", "ddplab_entrypoint_args", "ddplab_rdzv_timeout",
            "ddplab_max_restarts", *SETTING_FIELD, EXTRA_ARGS)
MODULE = re.compile(r"-m\s+(\S.*)")


def launch_command(settings: dict, pythonpath: str, data: str, run_dir: str, run_id: str,
                   resume=False) -> dict:
    """{"module": the module torchrun runs ("" for a script), "script": the script's path on the node (""
    for a module), "args": its arguments, "trainer_argv": what torchrun runs (after its own flags),
    "threads_flag": the flag the built-in trainer takes the node's thread count with ("" for your code: it
    gets OMP/MKL_NUM_THREADS only), "torchrun_flags": torchrun's own flags for a run of fixed size}."""
    byo = bool(settings["ddplab_code_dir"])
    entrypoint = str(settings["ddplab_entrypoint"]).strip()
    named = MODULE.fullmatch(entrypoint)
    module = "trainer" if not byo else named.group(1).strip() if named else ""
    script = "" if module else f"{pythonpath}/{entrypoint}"
    args = ([str(a) for a in settings["ddplab_entrypoint_args"]] if byo
            else launch_flags(settings, data, f"{run_dir}/out", run_id, resume))
    return {"module": module, "script": script, "args": args,
            "trainer_argv": (["-m", module] if module else [script]) + args,
            "threads_flag": "" if byo else "--threads",
            "torchrun_flags": ["--rdzv-conf", f"timeout={settings['ddplab_rdzv_timeout']}",
                               "--max-restarts", str(settings["ddplab_max_restarts"])]}
