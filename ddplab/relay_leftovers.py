"""``python -m ddplab relay-leftovers RUNS_DIR``: remove the relay key pair an older ddplab made on the
control host, ``RUNS_DIR/.relay/id_ed25519`` and its ``.pub`` (one lab key for every node, before each
node made its own: nodeprobe/relay_access.py). The nodes' lines for it went on the next prepare (a line
without a peer name goes), but the private key stayed in runs/ (stop.yml's cleanup runs this, with the
relay's node side).

Only what ddplab provably made goes: the two files by those names, the public half's comment exactly
``ddplab-relay`` (what that ddplab gave ``ssh-keygen -C``), and the private key's own public half equal to
it (``ssh-keygen -y``); anything else, or a pair that fails a check, stays. The folder goes only when
nothing else is in it. Prints ``{"removed": [paths]}``.
"""

from __future__ import annotations

import json
import os
import subprocess

# under ddplab_runs_dir: where roles/relay_ssh kept the lab's one key before each node made its own
OLD_KEY = os.path.join(".relay", "id_ed25519")
OLD_COMMENT = "ddplab-relay"


def public_half(key: str) -> list[str] | None:
    """The private key's public half (type and base64), or None when ssh-keygen cannot read it."""
    proc = subprocess.run(["ssh-keygen", "-y", "-f", key], capture_output=True, text=True, timeout=30,
                          check=False, stdin=subprocess.DEVNULL)
    return proc.stdout.split()[:2] if proc.returncode == 0 else None


def made_by_ddplab(key: str) -> bool:
    """Whether `key` and `key`.pub are the pair an older ddplab made (see the module docstring)."""
    if os.path.islink(key) or os.path.islink(key + ".pub") or not os.path.isfile(key + ".pub"):
        return False
    with open(key + ".pub", encoding="utf-8", errors="replace") as f:
        words = f.read().split()
    return len(words) == 3 and words[2] == OLD_COMMENT and public_half(key) == words[:2]


def forget(runs_dir: str) -> list[str]:
    """Remove the old control-side relay key pair under `runs_dir` (and its folder when empty)."""
    key = os.path.join(runs_dir, OLD_KEY)
    if not os.path.isfile(key) or not made_by_ddplab(key):
        return []
    removed = []
    for path in (key, key + ".pub"):
        os.unlink(path)
        removed.append(path)
    folder = os.path.dirname(key)
    if not os.listdir(folder):
        os.rmdir(folder)
        removed.append(folder)
    return removed


def add_parser(sub):
    p = sub.add_parser("relay-leftovers", help="remove the relay key pair an older ddplab made under runs/")
    p.add_argument("runs_dir", help="ddplab_runs_dir")
    p.set_defaults(func=cmd_relay_leftovers)


def cmd_relay_leftovers(args):
    print(json.dumps({"removed": forget(args.runs_dir)}))
    return 0
