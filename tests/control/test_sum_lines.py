"""roles/code_sync/filter_plugins/sum_lines.py: which planned files a node lacks, from the sum lines of both
sides (the sync itself runs on simulated hosts in tests/orchestrator and tests/byo)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "roles/code_sync/filter_plugins/sum_lines.py"
_spec = importlib.util.spec_from_file_location("sum_lines", PLUGIN)
sum_lines = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sum_lines)

FILES = [{"dest": "a.py"}, {"dest": "dir/b c.py"}, {"dest": "same.py"}]
CONTROL = ["11  a.py", "22  dir/b c.py", "33  same.py"]


def test_a_missing_file_and_one_with_other_bytes_are_sent_in_plan_order():
    node = ["33  same.py", "99  a.py", "44  extra.py"]
    assert sum_lines.files_to_send(FILES, CONTROL, node) == [{"dest": "a.py"}, {"dest": "dir/b c.py"}]


def test_nothing_is_sent_to_a_node_that_has_every_line():
    assert sum_lines.files_to_send(FILES, CONTROL, CONTROL + ["55  more.py"]) == []
    assert sum_lines.paths_of(["ab  x  y.txt"]) == ["x  y.txt"]  # a path with two spaces stays whole
