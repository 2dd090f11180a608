"""``nodeprobe firewall-read STATE_DIR HOST`` as root (shipped alone, stdlib only: roles/firewall, prepare and
cleanup): what the firewall role decides on, in one round trip.

Prints ``{"added": [the lines of `ufw show added`], "active": bool, "ports": "32768 60999" (the node's
ip_local_port_range: gloo listens there), "records": [...]}``. ``records`` are the firewall records ddplab
wrote in STATE_DIR (root's folder, out of the run users' reach) for HOST: each ``{"file", "comment", "root",
"host", "enabled_ufw", "lab_there"}`` (root None: a record from before records named their lab folder);
``lab_there`` says whether the lab folder the record names still holds a ddplab lab (its marker): a record
whose folder is gone is a lab that moved or went, so its rules are leftovers
(roles/firewall/filter_plugins/ufw_rules.py ``ufw_leftovers`` decides).
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

MARKER = ".ddplab-lab"  # nodeprobe/prereqs.py ROOT_MARKER (this program runs alone: no import)
RECORD = "firewall-{comment}-{host}.json"  # roles/firewall/defaults: firewall_state_file


def ufw(*args: str) -> str:
    proc = subprocess.run(["ufw", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"ddplab: error: ufw {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def records(state_dir: str, host: str) -> list[dict]:
    """The firewall records of `host` in `state_dir` (unreadable or foreign files are skipped)."""
    out = []
    pattern = os.path.join(glob.escape(state_dir), RECORD.format(comment="*", host=glob.escape(host)))
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or not isinstance(record.get("comment"), str) \
                or record.get("host", host) != host:  # records before this one name no host
            continue
        root = record.get("root")
        root = root if isinstance(root, str) else None
        out.append({"file": path, "comment": record["comment"], "root": root, "host": host,
                    "enabled_ufw": record.get("enabled_ufw") is True,
                    "lab_there": root is not None and os.path.isfile(os.path.join(root, MARKER))})
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: firewall_read.py STATE_DIR HOST", file=sys.stderr)
        return 2
    state_dir, host = argv
    added = [ln for ln in ufw("show", "added").splitlines() if ln.startswith("ufw ")]
    active = any(ln.strip() == "Status: active" for ln in ufw("status").splitlines())
    with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as f:
        ports = " ".join(f.read().split())
    print(json.dumps({"added": added, "active": active, "ports": ports, "records": records(state_dir, host)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
