"""python -m ddplab {report,follow,validate,settings}: control-side tools next to the Ansible playbooks."""

import argparse
import sys

from ddplab import follow, report, settings
from ddplab.errors import DdplabError


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddplab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    report.add_parser(sub)
    follow.add_parser(sub)
    settings.add_parser(sub)
    args = ap.parse_args(argv)
    try:
        return args.func(args) or 0
    except DdplabError as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
