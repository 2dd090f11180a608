"""python -m ddplab VERB: the control-side tools next to the Ansible playbooks.

report, follow, status (a run's outcome, live panes, which node failed first); validate, settings (check
every setting before a node is touched; write the generated defaults and docs); preflight-verdict (judge
the preflight's probes); smoke-verdict (decide the launch from the smoke run of your code); compile-ship
(which nodes get the master's warm torch.compile cache); code-tree (plan a code sync); sync-push (rsync
files to a node, with progress); distribution (star or relay, and why); relay (send changed files once,
the nodes pass them on); relay-leftovers (the relay key an older ddplab left in runs/); interrupt-guard
(stop a run when its waiting playbook is interrupted); check-requirements (refuse a requirements file that
asks for another torch); tune (tokens/s of 1 node x 1 process, 1 node x N processes and all nodes); export
sbatch (the run as a self-contained sbatch script for a Slurm cluster ddplab does not manage); secrets
(the lab's 0700 folder of control-side keys).
"""

import argparse
import importlib
import sys

from ddplab.errors import DdplabError

# verb -> the module whose add_parser(sub) defines it. Only the chosen verb's module is imported, so a
# quick verb run by a playbook (validate, status) does not pay for matplotlib.
VERBS = {
    "report": "ddplab.report",
    "follow": "ddplab.follow",
    "status": "ddplab.status",
    "code-check": "ddplab.code_check",
    "smoke-verdict": "ddplab.smoke_verdict",
    "compile-ship": "ddplab.compile_ship",
    "validate": "ddplab.settings",
    "plan": "ddplab.plan",
    "settings": "ddplab.settings",
    "preflight-verdict": "ddplab.preflight.verdict",
    "code-tree": "ddplab.code_tree",
    "sync-push": "ddplab.sync_push",
    "relay": "ddplab.relay",
    "relay-leftovers": "ddplab.relay_leftovers",
    "distribution": "ddplab.distribution",
    "interrupt-guard": "ddplab.interrupt_guard",
    "check-requirements": "ddplab.check_requirements",
    "rdzv-store": "ddplab.rdzv_store",
    "tune": "ddplab.tune",
    "export": "ddplab.export_sbatch",
    "secrets": "ddplab.secrets",
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m ddplab", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    chosen = [VERBS[argv[0]]] if argv and argv[0] in VERBS else sorted(set(VERBS.values()))
    for module in dict.fromkeys(chosen):
        importlib.import_module(module).add_parser(sub)
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
