"""``values | flags('--name')``: each value as one ``--name=value`` argument (an argv list, not one string).

    argv: "{{ [run_dir, archive] + logs_patterns | flags('--pattern') }}"   -> [..., '--pattern=*.log', ...]

A mapping gives ``--name=key=value`` per item (``{'tmux': 'tmux'} | flags('--command')``).
"""

from __future__ import annotations

from collections.abc import Mapping


def flags(values, name: str) -> list[str]:
    items = [f"{k}={v}" for k, v in values.items()] if isinstance(values, Mapping) else list(values or [])
    return [f"{name}={value}" for value in items]


class FilterModule:
    def filters(self):
        return {"flags": flags}
