"""The code sync's lists, built in Python (the tasks only fill values in):

    {{ code_sync_trees | sync_trees(ddplab_code_dir, ddplab_code_subdir, ddplab_code_include) }}
      -> every tree `python -m ddplab code-tree` plans: the lab's (mode all), then the user's code
    {{ code_sync_push_files | push_dests }}  -> each file's node path (a name, or a {src, dest}'s dest)
"""

from __future__ import annotations


def sync_trees(trees: list[dict], code_dir: str, code_subdir: str, include: list[str]) -> list[dict]:
    """The lab's trees, every file of them (mode all), and with ddplab_code_dir set the user's code folder
    under code_subdir, as git would see it (mode gitignore) plus ddplab_code_include."""
    out = [{**t, "mode": "all"} for t in trees or []]
    if code_dir:
        out.append({"src": code_dir, "dest": code_subdir, "mode": "gitignore", "include": include})
    return out


def push_dests(files: list) -> list[str]:
    """The node path of each file to send: names as they are, then each {src, dest}'s dest."""
    files = files or []
    names = [f for f in files if isinstance(f, str)]
    return names + [f["dest"] for f in files if isinstance(f, dict) and "dest" in f]


class FilterModule:
    def filters(self):
        return {"sync_trees": sync_trees, "push_dests": push_dests}
