"""The docs' results tables are their reports' (bench/docs_tables.py), and a stale one is named."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
import docs_tables  # noqa: E402


def test_every_marked_table_is_its_reports():
    proc = subprocess.run([sys.executable, "bench/docs_tables.py", "--check"], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = "".join(p.read_text() for p in docs_tables.pages())
    for name in docs_tables.TABLES:  # each table is shown somewhere
        assert f"<!-- table: {name} -->" in shown


def test_a_hand_edited_table_is_put_back_and_an_unknown_one_is_refused():
    page = "intro\n<!-- table: relaunch -->\n| typed by hand |\n<!-- /table -->\nafter\n"
    fixed = docs_tables.refresh(page, "page.md")
    assert "typed by hand" not in fixed and docs_tables.render("relaunch") in fixed
    assert fixed.startswith("intro\n") and fixed.endswith("<!-- /table -->\nafter\n")
    try:
        docs_tables.refresh("<!-- table: nosuch -->\n<!-- /table -->", "page.md")
    except SystemExit as e:
        assert "page.md names table 'nosuch'" in str(e)
    else:
        raise AssertionError("an unknown table was accepted")


def test_a_marker_that_opens_no_table_is_refused():
    for page in ("<!-- table: Relaunch -->\n| x |\n<!-- /table -->\n",  # a name markers cannot hold
                 "<!-- table: relaunch -->\n| x |\n"):  # no closing marker
        try:
            docs_tables.refresh(page, "page.md")
        except SystemExit as e:
            assert "page.md has 1 '<!-- table:' markers but 0 tables" in str(e)
        else:
            raise AssertionError(f"a table that is never rewritten was accepted: {page!r}")
