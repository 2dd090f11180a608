"""Checks that ask another authority: the trainer's own config validation, and the torch wheel sources.

- Trainer flags (built-in trainer only) are checked by `trainer.config` itself, imported here, with the
  flags every launch gives it (ddplab/trainer_flags.py, and --threads as launch.sh adds it), so
  the trainer's rules live once.
- The torch pin is known good when it is the control host's own torch; otherwise the configured wheel
  folder is listed, or pip is asked once (`pip index versions torch`) with a short timeout. An index
  that cannot be reached is a warning: the nodes install from it later and say so.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys

from ddplab.settings.problems import Problem
from ddplab.trainer_flags import FLAG_SETTING, launch_flags

# The index of torch's CPU wheels (PyPI's Linux torch is the CUDA one): torch_env's extra index (through the
# lookup ddplab_constant), `make wheelhouse`'s and `export sbatch`'s.
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP_TIMEOUT_S = 8


def trainer_argv(v: dict) -> list[str]:
    """The built-in trainer's flags as a launch gives them (ddplab/trainer_flags.py, through
    ddplab/launch_command.py; placeholders for node paths), with the thread count launch.sh adds. Only the
    trainer's settings are read: a bad value of another one is said by its own check."""
    argv = launch_flags(v, v["ddplab_data_dir"] or "data", "run/out", v["ddplab_run_id"] or "run-check",
                        v["ddplab_resume"])
    return argv + ["--threads", str(v["ddplab_threads"] or 1)]


def trainer_message(argv: list[str]) -> str | None:
    """The trainer's complaint about argv, or None. Uses trainer.cli.check_args when it exists."""
    from trainer import cli, config

    check = getattr(cli, "check_args", None)
    if check is not None:
        return check(argv)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli.parse_config(argv)
    except config.UsageError as e:
        return str(e)
    except SystemExit:  # argparse: unknown flag, bad type; its one line is on stderr
        return err.getvalue().strip().removeprefix("ddplab: error: ") or "the trainer refused its flags"
    return None


def trainer_args(v: dict) -> list[Problem]:
    if v["ddplab_entrypoint"]:
        return []
    message = trainer_message(trainer_argv(v))
    if message is None:
        return []
    extra = " ".join(v["ddplab_trainer_extra_args"])
    name = next((s for flag, s in FLAG_SETTING.items() if flag in message and flag not in extra),
                "ddplab_trainer_extra_args")
    value = v[name]
    return [Problem(name, f"{json.dumps(value)}: the trainer says \"{message}\"",
                    "what `python -m trainer --help` accepts", f"change {name}", hosts=[])]


def _public(version: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).public
    except InvalidVersion:
        return version


def control_torch() -> str | None:
    """The control host's torch version, read from torch/version.py (importing torch takes seconds)."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py")) as f:
            m = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", f.read(), re.M)
    except OSError:
        return None
    return m[1] if m else None


def _wheel_versions(folder: str) -> set[str]:
    names = os.listdir(folder)
    return {m[1] for n in names if (m := re.match(r"torch-([^-]+)-.*\.whl$", n))}


def pip_versions(index_url: str, find_links: str) -> tuple[set[str] | None, str]:
    """Versions of torch the configured index offers, or (None, why the index could not be asked)."""
    argv = [sys.executable, "-m", "pip", "index", "versions", "torch", "--disable-pip-version-check",
            "--timeout", "3", "--retries", "0"]
    argv += ["--extra-index-url", CPU_INDEX] if CPU_INDEX else []
    argv += ["--index-url", index_url] if index_url else []
    argv += ["--find-links", find_links] if "://" in find_links else []  # else a folder on the nodes
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"pip did not answer in {PIP_TIMEOUT_S} s ({type(e).__name__})"
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("Available versions:")), None)
    if line is None:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return None, f"pip index versions torch failed: {tail}"
    return {x.strip() for x in line.split(":", 1)[1].split(",") if x.strip()}, ""


def torch_pin(v: dict) -> list[Problem]:
    pin = v["ddplab_torch_version"]
    fix = f"set ddplab_torch_version to a version that exists there (this control host runs {_installed()})"
    installed = control_torch()
    if installed and pin == installed.split("+")[0]:  # the cheap rule: this host runs it
        return []
    links, index = v["ddplab_pip_find_links"], v["ddplab_pip_index_url"]
    if links and os.path.isdir(links):
        have = _wheel_versions(links)
        if pin in have or pin in {_public(x) for x in have}:
            return []
        return [Problem("ddplab_torch_version", f"{pin} has no wheel in {links} (it has "
                        f"{', '.join(sorted(have)) or 'no torch wheel'})",
                        "a torch version of the configured wheel folder", fix, hosts=[])]
    have, why = pip_versions(index, links)
    where = f"the index {index or 'PyPI'}" + (f" (+ {CPU_INDEX})" if CPU_INDEX else "")
    if have is None:
        return [Problem("ddplab_torch_version", f"{pin} could not be checked: {why}",
                        f"a torch version that {where} offers",
                        "the nodes will install it from there; check the index if that fails", hosts=[],
                        level="warning")]
    if pin in have or pin in {_public(x) for x in have}:
        return []
    newest = sorted(have, key=_sort_key, reverse=True)[:6]
    return [Problem("ddplab_torch_version", f"{pin} is not offered by {where}",
                    f"one of its versions ({', '.join(newest)}, ...)", fix, hosts=[])]


def _sort_key(version: str):
    from packaging.version import InvalidVersion, Version

    try:
        return (1, Version(version))
    except InvalidVersion:
        return (0, Version("0"))


def _installed() -> str:
    installed = control_torch()
    return installed.split("+")[0] if installed else "no torch"
