"""torch_env's lists, built in Python (the tasks only fill values in):

    {{ torch_env_wheels.files | wheels_to_push(torch_env_have.stdout_lines) }}
      -> the wheels the node's wheelhouse lacks, or holds with other bytes (sha256sum's lines from the node)
    {{ python | pip_install(constraints, wheelhouse=W) }}  -> pip install offline: hashes on stdin, W only
    {{ python | pip_install(constraints, requirements=R, index_url=U, find_links=F, extra_index_url=E) }}
      -> pip install from the index (the empty ones left out)
    {{ python | venv_create(folder, with_pip=false) }}  -> make a venv with that Python

Both run the node's Python as `python -I -m`: `-m` alone puts the working folder (the login folder, the
requirements' folder) first on sys.path, where a user's tokenize.py, traceback.py or logging.py stands in for
the standard library's and stops `-m venv` (and `-m pip` in a venv with setuptools' distutils .pth, which
Python 3.11's venvs have). -I leaves it out, and PYTHON* variables and the user's site-packages; a venv's
.pth files still count (the code venv sees the pinned Python's packages through one).
"""

from __future__ import annotations

import re

SUM_LINE = re.compile(r"^(\S+)\s+\*?(.*)$")  # sha256sum: "<sha256>  <file>" (or " *<file>" in binary mode)


def wheels_to_push(files: list[dict], sum_lines: list[str] | None) -> list[dict]:
    """The wheels ({file, sha256, ...}) whose file the node lacks or whose sha256 there is another."""
    have = {m.group(2): m.group(1) for m in map(SUM_LINE.match, sum_lines or []) if m}
    return [f for f in files if have.get(f["file"]) != f["sha256"]]


ISOLATED_MODULE = ("-I", "-m")  # see above


def pip_install(python: str, constraints: str, requirements: str = "/dev/stdin", wheelhouse: str = "",
                index_url: str = "", find_links: str = "", extra_index_url: str = "") -> list[str]:
    """The argv of `pip install -r requirements -c constraints` in the venv of `python`: with `wheelhouse`
    offline and by hashes (--no-index --require-hashes), else from the index options given; no -c when
    `constraints` is empty (the lab venv's torch, numpy and pyarrow: the hashes pin them)."""
    argv = [python, *ISOLATED_MODULE, "pip", "install", "--disable-pip-version-check"]
    if wheelhouse:
        argv += ["--no-index", "--find-links", wheelhouse, "--require-hashes"]
    argv += ["-r", requirements] + (["-c", constraints] if constraints else [])
    for flag, value in (("--index-url", index_url), ("--find-links", find_links),
                        ("--extra-index-url", extra_index_url)):
        if value:
            argv += [flag, value]
    return argv


def venv_create(python: str, folder: str, with_pip: bool = False) -> list[str]:
    """The argv that makes a venv in `folder` with `python` (without pip of its own unless `with_pip`)."""
    return [python, *ISOLATED_MODULE, "venv", *([] if with_pip else ["--without-pip"]), folder]


class FilterModule:
    def filters(self):
        return {"wheels_to_push": wheels_to_push, "pip_install": pip_install, "venv_create": venv_create}
