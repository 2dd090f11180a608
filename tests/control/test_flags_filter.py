"""plugins/filter/ddplab_flags.py: a list (or a mapping) as --name=value arguments, one argv element each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ddplab_flags", REPO / "plugins/filter/ddplab_flags.py")
flags_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flags_module)


def test_each_value_is_one_argument_even_with_spaces_and_equals():
    assert flags_module.flags(["*.log", "a b=c"], "--pattern") == ["--pattern=*.log", "--pattern=a b=c"]


def test_a_mapping_gives_key_value_and_nothing_gives_nothing():
    assert flags_module.flags({"tmux": "tmux", "rsync": "rsync"}, "--command") == ["--command=tmux=tmux",
                                                                                   "--command=rsync=rsync"]
    assert flags_module.flags([], "--glob") == [] and flags_module.flags(None, "--glob") == []
