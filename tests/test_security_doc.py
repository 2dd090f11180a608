"""docs/security.md is the threat model: every row of its table names a party, an asset and at least one
test, and every test it names exists (a renamed or deleted attack test fails here, not silently)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "security.md"
PARTIES = ("LAN", "Local user", "Rogue node", "Repository", "Package index")
TEST_REF = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def table_rows() -> list[list[str]]:
    text = PAGE.read_text()
    table = text.split("<!-- security table")[1].split("\n\n")[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| party")]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def functions_in(path: str) -> set[str]:
    tree = ast.parse((REPO / path).read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_row_names_a_party_an_asset_and_a_test():
    rows = table_rows()
    assert rows, "docs/security.md has no table rows"
    for row in rows:
        assert len(row) == 5, row
        party, asset, guarantee, how, tests = row
        assert party in PARTIES, f"unknown party {party!r}; the page lists {PARTIES}"
        assert asset and guarantee and how, row
        assert TEST_REF.search(tests), f"row without a test: {row}"
    assert {row[0] for row in rows} == set(PARTIES), "a party has no row"


def test_every_test_the_page_names_exists():
    named = TEST_REF.findall(PAGE.read_text())
    assert named
    missing = [f"{path}::{name}" for path, name in named
               if not (REPO / path).is_file() or name not in functions_in(path)]
    assert missing == [], f"docs/security.md names tests that do not exist: {missing}"
