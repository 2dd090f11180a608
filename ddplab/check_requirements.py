"""``python -m ddplab check-requirements``: refuse a requirements file that asks for another torch
than the lab's pin (run on the control host).

Usage: check-requirements REQUIREMENTS_FILE TORCH_VERSION. Reads the file (and the files it includes
with -r / -c, relative to it). A line naming torch is refused when it is a URL or path requirement, or when
its version specifier does not allow TORCH_VERSION. Exit 0: fine; 2: one `ddplab: error:` line per problem,
naming the file and the line. Nothing is installed. Other packages that need another torch are caught by
pip itself: the install runs with `-c constraints.txt` (torch==TORCH_VERSION) and fails before installing.
"""

import os
import re
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import Version
except ImportError:  # pragma: no cover - ansible-core depends on packaging
    Requirement = None

NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def problems(path, pin, seen):
    real = os.path.realpath(path)
    if real in seen:
        return []
    seen.add(real)
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        return [f"cannot read requirements file {path}: {e.strerror}; fix ddplab_pip_requirements"]
    out = []
    for n, raw in enumerate(lines, 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        include = re.match(r"^(-r|--requirement|-c|--constraint)\s*=?\s*(\S+)", line)
        if include:
            out += problems(os.path.join(os.path.dirname(path), include[2]), pin, seen)
            continue
        if line.startswith("-"):
            continue
        m = NAME.match(line)
        if not m or normalize(m[1]) != "torch":
            continue
        bad = None
        if Requirement is not None:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                bad = "a line pip may read as another torch"
            else:
                if req.url:
                    bad = f"torch from {req.url}"
                elif req.specifier and not req.specifier.contains(Version(pin), prereleases=True):
                    bad = f"torch{req.specifier}"
        elif (re.search(r"[=<>~!]=?\s*\d", line)
              and not re.search(rf"(==|>=|<=|~=)\s*{re.escape(pin)}\b", line)):
            bad = "another torch"
        if bad:
            out.append(f"{path} line {n} asks for {bad} ({raw.strip()!r}); every node runs torch=={pin} "
                       f"(ddplab_torch_version): remove or relax that line")
    return out


def add_parser(sub):
    p = sub.add_parser("check-requirements", help="refuse a requirements file that asks for another torch")
    p.add_argument("requirements", help="the requirements file (ddplab_pip_requirements)")
    p.add_argument("torch_version", help="the lab's torch pin (ddplab_torch_version)")
    p.set_defaults(func=cmd_check_requirements)


def cmd_check_requirements(args):
    found = problems(args.requirements, args.torch_version, set())
    for p in found:
        print(f"ddplab: error: {p}", file=sys.stderr)
    return 2 if found else 0
