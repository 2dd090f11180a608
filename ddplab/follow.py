"""Live view of every node's tmux pane for a run, over SSH with paramiko (no OpenSSH client needed).

`python -m ddplab follow -i inventory/simlan` reads the same inventory as the playbooks, opens one SSH
connection per node (hosts with ansible_connection=local are read directly), and prints each new pane
line prefixed with the node's name until every rank's pane is dead (or Ctrl-C). A dropped connection is
reopened; the run itself lives in tmux on the node and does not notice.
"""

import shlex
import subprocess
import sys
import time

from ddplab.errors import DdplabError
from ddplab.inventory import load_nodes


def _remote_path(path):
    """Shell text for a node path, expanding a leading ~ on the node."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if len(path) > 1 else '"$HOME"'
    return shlex.quote(path)


class Conn:
    """Runs shell commands on one node: locally, or through a paramiko SSH client."""

    def __init__(self, node, timeout=10.0):
        self.node, self.timeout, self.client = node, timeout, None

    def _connect(self):
        import paramiko

        client = paramiko.SSHClient()
        # Lab nodes (and simulated hosts) get new host keys when rebuilt, as the inventory's
        # UserKnownHostsFile=/dev/null says; keys are not stored.
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        try:
            client.connect(self.node.host, port=self.node.port, username=self.node.user,
                           key_filename=self.node.key_file, timeout=self.timeout,
                           banner_timeout=self.timeout, auth_timeout=self.timeout,
                           allow_agent=self.node.key_file is None, look_for_keys=self.node.key_file is None)
        except Exception as e:  # paramiko raises many types: name the host and the cause once
            client.close()
            raise DdplabError(f"cannot reach {self.node.name} ({self.node.user or ''}@{self.node.host}:"
                              f"{self.node.port}) over SSH: {e}") from e
        self.client = client

    def run(self, cmd):
        if self.node.connection == "local":
            out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                                 timeout=self.timeout, check=False)
            return out.returncode, out.stdout
        for attempt in (1, 2):
            try:
                if self.client is None:
                    self._connect()
                _, stdout, _ = self.client.exec_command(cmd, timeout=self.timeout)
                text = stdout.read().decode(errors="replace")
                return stdout.channel.recv_exit_status(), text
            except DdplabError:
                if attempt == 2:
                    raise
            except Exception:  # connection dropped (sshd restarted): reconnect once
                if attempt == 2:
                    raise
            self.close()
            time.sleep(0.5)
        return 255, ""

    def close(self):
        if self.client is not None:
            self.client.close()
            self.client = None


def pane_state(conn, run_id):
    """(dead, lines) of the run's pane; dead is None when the session does not exist."""
    root = _remote_path(conn.node.root.rstrip("/"))
    sock = f"{root}/tmux.sock"
    target = shlex.quote(f"={run_id}:")
    rc, out = conn.run(f"tmux -S {sock} display-message -p -t {target} '#{{pane_dead}}' 2>/dev/null && "
                       f"tmux -S {sock} capture-pane -p -J -S - -E - -t {target}")
    if rc != 0:
        return None, []
    first, _, rest = out.partition("\n")
    lines = rest.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return first.strip() == "1", lines


def last_run(conn):
    rc, out = conn.run(f"cat {_remote_path(conn.node.root.rstrip('/'))}/last_run")
    return out.strip() if rc == 0 and out.strip() else None


def follow(inventory, run_id=None, interval=2.0, once=False, out=sys.stdout, max_seconds=None):
    nodes = load_nodes(inventory)
    conns = [Conn(n) for n in nodes]
    try:
        if not run_id:
            master = conns[0]
            run_id = last_run(master)
            if not run_id:
                raise DdplabError(f"{master.node.name} has no last run in {master.node.root}; "
                                  "launch one (playbooks/launch.yml) or pass --run-id")
        width = max(len(c.node.name) for c in conns)
        printed = {c.node.name: 0 for c in conns}
        start = time.monotonic()
        names = ", ".join(c.node.name for c in conns)
        print(f"ddplab: following run {run_id} on {names}", file=out, flush=True)
        while True:
            states = []
            for c in conns:
                dead, lines = pane_state(c, run_id)
                states.append(dead)
                for line in lines[printed[c.node.name]:]:
                    print(f"{c.node.name:<{width}} | {line}", file=out)
                printed[c.node.name] = max(printed[c.node.name], len(lines))
            out.flush()
            if all(s is None for s in states):
                raise DdplabError(f"run {run_id} has no tmux session on any node; see playbooks/status.yml")
            if once or all(s in (True, None) for s in states):
                return 0
            if max_seconds is not None and time.monotonic() - start > max_seconds:
                return 0
            time.sleep(interval)
    finally:
        for c in conns:
            c.close()


def cmd_follow(args):
    return follow(args.inventory, run_id=args.run_id, interval=args.interval, once=args.once,
                  max_seconds=args.max_seconds)


def add_parser(sub):
    p = sub.add_parser("follow", help="print every node's tmux pane of a run live, over SSH (paramiko)")
    p.add_argument("-i", "--inventory", default="inventory/local", help="inventory folder or file")
    p.add_argument("--run-id", default=None, help="run to follow (default: the master's last run)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--once", action="store_true", help="print the panes once and exit")
    p.add_argument("--max-seconds", type=float, default=None, help="stop following after this long")
    p.set_defaults(func=cmd_follow)
