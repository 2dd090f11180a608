"""python -m ddplab VERB: the control-side tools next to the Ansible playbooks.

report, follow (a run's outcome and live panes); preflight-verdict (judge the preflight's probes);
code-tree (plan a code sync); interrupt-guard (stop a run when its waiting playbook is interrupted);
check-requirements (refuse a requirements file that asks for another torch).
"""

import argparse
import sys

from ddplab import check_requirements, code_tree, follow, interrupt_guard, report
from ddplab.errors import DdplabError
from ddplab.preflight import verdict


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ddplab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for verb in (report, follow, verdict, code_tree, interrupt_guard, check_requirements):
        verb.add_parser(sub)
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
