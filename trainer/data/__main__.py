"""`python -m trainer.data`: prepare or verify a shard folder.

    python -m trainer.data prepare --out DIR [--source SRC] [--docs N] [--rows-per-group R] [--seed S]
    python -m trainer.data verify DIR
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainer.config import UsageError
from trainer.data.shards import PREPARE_HINT, prepare, read_manifest, verify


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"ddplab: error: {message} (see `python -m trainer.data --help`)\n")
        sys.exit(2)


def main(argv=None) -> int:
    p = _Parser(prog="python -m trainer.data", description="Prepare or verify ddplab parquet shards.")
    sub = p.add_subparsers(dest="cmd", required=True)
    pp = sub.add_parser("prepare", help="write shards + manifest.json")
    pp.add_argument("--out", required=True, type=Path, help="output folder (replaced atomically)")
    pp.add_argument("--source", type=Path, default=None,
                    help="folder of .txt/.jsonl/.parquet (default: the built-in generated corpus)")
    pp.add_argument("--docs", type=int, default=None,
                    help="number of documents (default: 4096 generated, or all of --source)")
    pp.add_argument("--rows-per-group", type=int, default=64, help="rows (documents) per row group")
    pp.add_argument("--groups-per-shard", type=int, default=16, help="row groups per shard file")
    pp.add_argument("--seed", type=int, default=0, help="generator / shuffle seed")
    pv = sub.add_parser("verify", help="check every shard against manifest.json")
    pv.add_argument("dir", type=Path)
    args = p.parse_args(argv)
    try:
        if args.cmd == "prepare":
            print(prepare(args.out, args.source, args.docs, args.rows_per_group, args.groups_per_shard,
                          args.seed))
            return 0
        problems = verify(args.dir)
        if problems:
            print(f"ddplab: error: {len(problems)} problem(s) in {args.dir}: " + "; ".join(problems) +
                  f"; fix: re-run `{PREPARE_HINT.format(d=args.dir)}` with the master's flags or copy the "
                  f"folder from the master", file=sys.stderr)
            return 2
        m = read_manifest(args.dir)
        print(f"ok: {args.dir}: {len(m['files'])} files, "
              f"{sum(f['row_groups'] for f in m['files'])} row groups, digest {m['digest']}")
        return 0
    except UsageError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
