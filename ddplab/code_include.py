"""ddplab_code_include: files of the user's code folder to ship although git ignores them.

Prepared data (`data/**/*.bin`, `*.pkl`, `*.npy`), tokenizers: globs relative to the code folder, `**`
recursing, matched against files only. A glob that is absolute, climbs out with `..`, or matches no file is
refused (a data file that silently stays behind shows up only as a FileNotFoundError on every rank). A match
that is a link out of the folder is kept here, so that the plan (ddplab/code_tree.py) refuses it by name.
"""

from __future__ import annotations

import glob
import os

from ddplab.errors import DdplabError


def included_files(src: str, globs: list[str]) -> list[str]:
    """Relative paths (sorted) of the files under `src` that the globs match; DdplabError when one is bad."""
    out: set[str] = set()
    for pattern in globs:
        if not isinstance(pattern, str) or not pattern.strip() or os.path.isabs(pattern) \
                or ".." in pattern.replace("\\", "/").split("/"):
            raise DdplabError(f"ddplab_code_include: {pattern!r} is not a glob relative to ddplab_code_dir; "
                              'use paths inside the code folder, e.g. "data/**/*.bin"')
        hits = [p for p in glob.glob(pattern, root_dir=src, recursive=True)
                if os.path.isfile(os.path.join(src, p))]
        if not hits:
            raise DdplabError(f"ddplab_code_include: {pattern!r} matches no file in {src}; "
                              "prepare the data on the control host first, or fix the glob")
        out.update(os.path.normpath(p).replace(os.sep, "/") for p in hits)
    return sorted(out)
