"""The trainer's command line: TrainConfig's fields as kebab-case flags (help from FIELD_HELP), parsed and
validated into a TrainConfig, checked without a run (`check_args`, one line per problem), and spelled back
from values (`command_line`, for the launcher: ddplab/trainer_flags.py)."""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from trainer.config import (
    COMM_CHOICES,
    DEVICE_CHOICES,
    DTYPE_CHOICES,
    FIELD_HELP,
    SYNC_SCHEDULE_CHOICES,
    TrainConfig,
    UsageError,
)

CHOICES = {"dtype": DTYPE_CHOICES, "comm": COMM_CHOICES, "device": DEVICE_CHOICES,
           "sync_schedule": SYNC_SCHEDULE_CHOICES}


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors in ddplab's format (exit 2, no usage dump), or, for check_args,
    errors raised as _ArgumentProblem."""

    raise_errors = False

    def error(self, message):
        if self.raise_errors:
            raise _ArgumentProblem(message)
        sys.stderr.write(f"ddplab: error: {message} (see `python -m trainer --help`)\n")
        sys.exit(2)


class _ArgumentProblem(Exception):
    """argparse's complaint about the flags (check_args turns it into one line)."""


def flag_of(name: str) -> str:
    """A TrainConfig field's command-line flag: --kebab-case."""
    return "--" + name.replace("_", "-")


def command_line(values: dict) -> list[str]:
    """The flags that set `values` ({TrainConfig field: value}, in their order), as build_parser reads them:
    a switch gives its flag when it differs from its default (`--no-x` for one that is on by default), any
    other field `--flag value`. The launcher (ddplab/trainer_flags.py) spells what it passes with it."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig) if not f.name.startswith("_")}
    argv = []
    for name, value in values.items():
        if name not in fields:
            raise ValueError(f"the trainer has no setting {name!r} (trainer/config.py TrainConfig)")
        if fields[name].type in ("bool", bool):
            if bool(value) != fields[name].default:
                argv.append(flag_of(name) if value else "--no-" + flag_of(name)[2:])
        else:
            argv += [flag_of(name), str(value)]
    return argv


def build_parser(raise_errors: bool = False) -> argparse.ArgumentParser:
    p = _Parser(prog="python -m trainer", description="ddplab: train a small GPT with CPU DDP over gloo. "
                "Run alone (1 rank) or under torchrun. `python -m trainer --check-args ARGS...` only "
                "validates ARGS (exit 0, or 2 with one line).", add_help=not raise_errors)
    p.raise_errors = raise_errors
    defaults = TrainConfig.__dataclass_fields__
    for f in dataclasses.fields(TrainConfig):
        if f.name.startswith("_"):
            continue
        flag = flag_of(f.name)
        helptext = FIELD_HELP[f.name]
        default = defaults[f.name].default
        if f.type in ("bool", bool):  # on by default: --flag / --no-flag
            action = argparse.BooleanOptionalAction if default else "store_true"
            p.add_argument(flag, action=action, default=default, help=helptext)
        else:
            typ = {"int": int, "float": float, "str": str}[str(f.type)]
            kw = {"choices": CHOICES[f.name]} if f.name in CHOICES else {}
            req = f.name in ("data", "out")
            p.add_argument(flag, type=typ, default=None if req else default, required=req,
                           metavar=f.name.upper(), help=helptext + ("" if req else f" (default: {default})"),
                           **kw)
    return p


def parse_config(argv=None) -> TrainConfig:
    """Flags -> validated TrainConfig. Raises UsageError (a ValueError) on an invalid combination."""
    args = build_parser().parse_args(argv)
    return TrainConfig(**vars(args))


def check_args(argv: list[str]) -> str | None:
    """None when `argv` is a valid trainer command line, else one line saying which argument is wrong
    and what is allowed (`trainer argument ...: <what>; <allowed>`, without the `ddplab: error: `).

    Parses and validates exactly as a run does (--data and --out are required, their folders are not
    looked at), without torch and without a process group: the settings check calls it on the control
    host with the arguments the launch role will pass.
    """
    parser = build_parser(raise_errors=True)
    try:
        TrainConfig(**vars(parser.parse_args([str(a) for a in argv])))
    except _ArgumentProblem as e:
        return _argparse_line(str(e), parser)
    except UsageError as e:
        return _validation_line(str(e))
    return None


def _argparse_line(message: str, parser: argparse.ArgumentParser) -> str:
    if message.startswith("the following arguments are required: "):
        flags = message.split(": ", 1)[1]
        return f"trainer argument {flags}: not given; required by every run (the launch role passes them)"
    if message.startswith("unrecognized arguments: "):
        return (f"trainer argument {message.split(': ', 1)[1]}: unknown flag; the flags are those listed "
                f"by `python -m trainer --help`")
    m = re.match(r"argument (\S+?)(?:/\S+)?: (.*)$", message)
    if not m:
        return f"trainer arguments: {message}; see `python -m trainer --help`"
    flag, what = m.groups()
    what = re.sub(r" \(choose from .*\)$", "", what)  # the choices follow as what is allowed
    action = next((a for a in parser._actions if flag in a.option_strings), None)
    if action is not None and action.choices:
        allowed = "one of " + ", ".join(map(str, action.choices))
    elif action is not None and action.type in (int, float):
        allowed = "a whole number" if action.type is int else "a number"
    elif action is not None and action.nargs == 0:
        allowed = f"{flag} takes no value"
    else:
        allowed = "see `python -m trainer --help`"
    return f"trainer argument {flag}: {what}; {allowed}"


def _validation_line(message: str) -> str:
    m = re.match(r"(--[a-z0-9-]+) ((?:must|may) .*?), got (.*)$", message)
    if m:
        flag, rule, got = m.groups()
        return f"trainer argument {flag}: {got} given; {flag} {rule}"
    flag = re.search(r"--[a-z0-9-]+", message)
    return f"trainer argument {flag.group(0) if flag else '--n-embd/--n-head'}: {message}"

