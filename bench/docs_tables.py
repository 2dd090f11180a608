"""The results tables of the docs pages, generated from bench/results/ (never typed by hand).

A table lives in a docs page between two markers naming its source:

    <!-- table: lowcomm -->
    | ... |
    <!-- /table -->

    .venv/bin/python bench/docs_tables.py          # rewrite every marked table from its report.json
    .venv/bin/python bench/docs_tables.py --check  # exit 1 naming each table that differs

tests/bench/test_docs_tables.py runs the check, so a table in the docs is always its report's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
BLOCK = re.compile(r"(<!-- table: (?P<name>[a-z_]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)


def spread(x: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(x['median'])} [{fmt.format(x['min'])}-{fmt.format(x['max'])}]"


def relative(x: dict) -> str:
    def p(v: float) -> str:
        return f"{(v - 1) * 100:+.1f} %"
    return p(x["median"]) if x["n"] == 1 else f"{p(x['median'])} [{p(x['min'])} to {p(x['max'])}]"


def lowcomm(rep: dict) -> list[str]:
    """bench/lowcomm.py's modes against per-step fp32 DDP (the reference row left out)."""
    rows = ["| mode | bytes per step vs DDP | val loss vs per-step fp32 DDP, median [min to max] | seeds "
            "| outer steps |", "|---|---|---|---|---|"]
    for mode in rep["modes"].values():
        flags = " ".join(f for f in mode["flags"] if f != "--allow-local-sgd")
        if not flags or flags == "--sync-every 1":
            continue
        rows.append(f"| {mode['label']} (`{flags}`) | 1/{mode['fewer_bytes']:.1f} | "
                    f"{relative(mode['val_loss_vs_ddp'])} | {len(mode['seeds'])} | {mode['outer_steps']} |")
    return rows


def relaunch(rep: dict) -> list[str]:
    """bench/relaunch.py: launch.yml against bare ssh + tmux, and a no-change prepare."""
    rows = ["| hosts | launch.yml -e ddplab_wait=true (s) | bare ssh+tmux (s) | ratio "
            "| no-change prepare.yml (s) |", "|---|---|---|---|---|"]
    for r in rep["results"]:
        rows.append(f"| {r['hosts']} | {spread(r['launch_s'])} | {spread(r['bare_s'])} | "
                    f"{spread(r['ratio'], '{:.2f}')} | {spread(r['prepare_nochange_s'])} "
                    f"(changed {max(r['prepare_changed'])}) |")
    return rows


def distribution(rep: dict) -> list[str]:
    """bench/distribution.py: star vs relay per uplink and node count, against one copy through the uplink."""
    size = rep["size_bytes"]
    rows = [f"| control uplink (LAN {rep['lan']}) | nodes | star (s) | relay (s) "
            f"| limit: {size / 2**20:,.0f} MiB / uplink (s) | relay vs limit "
            "| bytes that left the control host, star / relay (x size) |",
            "|---|---|---|---|---|---|---|"]

    def took(m: dict | None) -> str:
        return f"{m['median_s']:.1f} [{m['min_s']:.1f}-{m['max_s']:.1f}]" if m else "-"

    def sent(m: dict | None) -> str:
        return f"{m['control_bytes_median'] / size:.2f}" if m else "-"

    for name, per_nodes in rep["scenarios"].items():
        for nodes, modes in sorted(per_nodes.items(), key=lambda kv: int(kv[0])):
            star, relay = modes.get("star"), modes.get("relay")
            limit = (star or relay)["limit_s"]
            vs_limit = f"{relay['x_limit']:.2f}x" if relay else "-"
            rows.append(f"| {rep['uplinks'][name]} | {nodes} | {took(star)} | {took(relay)} | {limit:.1f} | "
                        f"{vs_limit} | {sent(star)} / {sent(relay)} |")
    return rows


TABLES = {"distribution": (RESULTS / "distribution" / "report.json", distribution),
          "lowcomm": (RESULTS / "lowcomm" / "report.json", lowcomm),
          "relaunch": (RESULTS / "relaunch" / "report.json", relaunch)}


def render(name: str) -> str:
    path, make = TABLES[name]
    return "\n".join(make(json.loads(path.read_text()))) + "\n"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def refresh(text: str, where: str) -> str:
    def one(m: re.Match) -> str:
        if m["name"] not in TABLES:
            raise SystemExit(f"docs_tables: {where} names table '{m['name']}', unknown to "
                             f"bench/docs_tables.py; known: {', '.join(TABLES)}")
        return m.group(1) + render(m["name"]) + m.group(4)
    return BLOCK.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report the tables that differ (exit 1)")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        new = refresh(text, str(page.relative_to(REPO)))
        if new != text:
            stale.append(str(page.relative_to(REPO)))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(f"docs_tables: out of date in {', '.join(stale)}; fix: .venv/bin/python bench/docs_tables.py")
        return 1
    print(f"docs_tables: {'rewrote ' + ', '.join(stale) if stale else 'every table is current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
