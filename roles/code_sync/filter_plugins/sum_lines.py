"""The code sync's comparison of "<sha256>  <path>" lines (nodeprobe/hashing.py's tree-json) in Python:

    {{ plan.files | files_to_send(plan.lines, node_lines) }}  -> the plan's files whose line the node lacks
    {{ lines | paths_of }}                                    -> the paths of sum lines
"""

from __future__ import annotations


def paths_of(lines) -> list[str]:
    """The path of each "<sha256>  <path>" line (a path may hold spaces)."""
    return [line.split("  ", 1)[1] if "  " in line else line for line in lines or []]


def files_to_send(files: list[dict], control_lines: list[str], node_lines: list[str]) -> list[dict]:
    """The planned files (each with its node path "dest") whose sum line the node does not have: missing
    there, or with other bytes."""
    differ = set(paths_of(set(control_lines) - set(node_lines or [])))
    return [f for f in files if f["dest"] in differ]


class FilterModule:
    def filters(self):
        return {"files_to_send": files_to_send, "paths_of": paths_of}
