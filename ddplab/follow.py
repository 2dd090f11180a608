"""Live view of every node's tmux pane for a run, over the OpenSSH client (as Ansible connects).
With ddplab_scheduler: slurm the ranks run in the job's srun step, not in tmux: follow reads each node's
`launch.log` instead (the same lines the pane would show), and a rank is done once its exit code is there.

`python -m ddplab follow -i inventory/simlan` reads the same inventory as the playbooks and runs `ssh` to
each node (hosts with ansible_connection=local are read directly), printing each new pane line prefixed
with the node's name until every rank's pane is dead (or Ctrl-C). ssh gets what Ansible would give it:
the inventory's user, port, key and ansible_ssh_common_args/extra_args, after ansible.cfg's
StrictHostKeyChecking=accept-new (ssh keeps an option's first value, so, as with Ansible, an inventory's
StrictHostKeyChecking=no does not override it); ~/.ssh/config and known_hosts apply, and a changed host
key stops follow with one message. One multiplexed connection per node (ControlMaster) is reused
between polls; a dropped connection is reopened; the run itself lives in tmux on the node.
"""

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

from ddplab.errors import DdplabError
from ddplab.inventory import load_nodes

# ansible.cfg's [ssh_connection] ssh_args, less what follow sets itself (ControlPath, BatchMode)
SSH_OPTIONS = ("-o", "StrictHostKeyChecking=accept-new", "-o", "ServerAliveInterval=5",
               "-o", "ServerAliveCountMax=3")
HOST_KEY_CHANGED = ("REMOTE HOST IDENTIFICATION HAS CHANGED", "Host key verification failed")
SSH_FAILED = 255  # ssh's own exit status for a connection or authentication failure


def _remote_path(path):
    """Shell text for a node path, expanding a leading ~ on the node."""
    if path == "~" or path.startswith("~/"):
        return '"$HOME"' + shlex.quote(path[1:]) if len(path) > 1 else '"$HOME"'
    return shlex.quote(path)


class Conn:
    """Runs shell commands on one node: locally, or with the OpenSSH client (one multiplexed master)."""

    def __init__(self, node, timeout=10.0, control_dir=None):
        self.node, self.timeout = node, timeout
        self.control_path = os.path.join(control_dir or tempfile.gettempdir(), f"follow-{node.name}")

    def ssh_argv(self, *extra):
        n = self.node
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(self.timeout)}",
                "-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_path}",
                "-o", "ControlPersist=30", *SSH_OPTIONS, *shlex.split(n.ssh_args)]
        if n.port is not None:
            argv += ["-p", str(n.port)]
        if n.user:
            argv += ["-l", n.user]
        if n.key_file:
            argv += ["-i", os.path.expanduser(n.key_file)]
        return [*argv, *extra, n.host]

    def _where(self):
        n = self.node
        return f"{n.name} ({n.user + '@' if n.user else ''}{n.host}{':' + str(n.port) if n.port else ''})"

    def run(self, cmd):
        if self.node.connection == "local":
            out = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True,
                                 timeout=self.timeout, check=False)
            return out.returncode, out.stdout
        err = ""
        for attempt in (1, 2, 3):
            try:
                out = subprocess.run([*self.ssh_argv(), "--", cmd], capture_output=True, text=True,
                                     timeout=self.timeout * 2, check=False, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                err = f"no answer within {self.timeout * 2:.0f} s"
            else:
                if out.returncode != SSH_FAILED:
                    return out.returncode, out.stdout
                err = out.stderr.strip()
                if any(m in err for m in HOST_KEY_CHANGED):
                    n = self.node
                    entry = f"[{n.host}]:{n.port}" if n.port not in (None, 22) else n.host
                    raise DdplabError(
                        f"{self._where()}: its SSH host key is not the one in known_hosts (ssh: Host key "
                        f"verification failed); follow, like ansible-playbook, does not connect to a host "
                        f"whose key changed; if the node was reinstalled, remove the old key "
                        f"(ssh-keygen -R '{entry}') and connect once, else find out why it changed")
            if attempt < 3:  # connection dropped (sshd restarted): reconnect
                time.sleep(attempt)
        last = err.splitlines()[-1] if err else "no output"
        raise DdplabError(f"cannot reach {self._where()} over SSH: {last}; check it with "
                          f"`{shlex.join(self.ssh_argv())} true`")

    def close(self):
        if self.node.connection != "local" and os.path.exists(self.control_path):
            subprocess.run([*self.ssh_argv("-O", "exit")], capture_output=True, timeout=10, check=False,
                           stdin=subprocess.DEVNULL)


def _flag_and_lines(out):
    """A probe's answer: its first line says "1" or not; the rest, trailing blanks off, are shown."""
    first, _, rest = out.partition("\n")
    lines = rest.split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    return first.strip() == "1", lines


def pane_state(conn, run_id):
    """(dead, lines) of the run's pane; dead is None when the session does not exist."""
    root = _remote_path(conn.node.root.rstrip("/"))
    sock = f"{root}/tmux.sock"
    target = shlex.quote(f"={run_id}:")
    rc, out = conn.run(f"tmux -S {sock} display-message -p -t {target} '#{{pane_dead}}' 2>/dev/null && "
                       f"tmux -S {sock} capture-pane -p -J -S - -E - -t {target}")
    if rc != 0:
        return None, []
    return _flag_and_lines(out)


def log_state(conn, run_id):
    """(done, lines) of a Slurm run's launch.log; done is None when the node has no folder for the run."""
    run_dir = f"{_remote_path(conn.node.root.rstrip('/'))}/runs/{shlex.quote(run_id)}"
    rc, out = conn.run(f"test -d {run_dir} || exit 3; test -e {run_dir}/exit_code && echo 1 || echo 0; "
                       f"cat {run_dir}/launch.log 2>/dev/null; true")
    if rc != 0:
        return None, []
    return _flag_and_lines(out)


def last_run(conn):
    rc, out = conn.run(f"cat {_remote_path(conn.node.root.rstrip('/'))}/last_run")
    return out.strip() if rc == 0 and out.strip() else None


def follow(inventory, run_id=None, interval=2.0, once=False, out=sys.stdout, max_seconds=None):
    nodes = load_nodes(inventory)
    if any(n.connection != "local" for n in nodes) and shutil.which("ssh") is None:
        raise DdplabError("follow: no `ssh` command on this host; install the OpenSSH client "
                          "(apt-get install openssh-client), which ansible-playbook needs too")
    control_dir = tempfile.mkdtemp(prefix="ddplab-follow-")  # ControlPath sockets: short and private
    conns = [Conn(n, control_dir=control_dir) for n in nodes]
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
                dead, lines = (log_state if c.node.scheduler == "slurm" else pane_state)(c, run_id)
                states.append(dead)
                for line in lines[printed[c.node.name]:]:
                    print(f"{c.node.name:<{width}} | {line}", file=out)
                printed[c.node.name] = max(printed[c.node.name], len(lines))
            out.flush()
            if all(s is None for s in states):
                where = "folder" if conns[0].node.scheduler == "slurm" else "tmux session"
                raise DdplabError(f"run {run_id} has no {where} on any node; see playbooks/status.yml")
            if once or all(s in (True, None) for s in states):
                return 0
            if max_seconds is not None and time.monotonic() - start > max_seconds:
                return 0
            time.sleep(interval)
    finally:
        for c in conns:
            c.close()
        shutil.rmtree(control_dir, ignore_errors=True)


def cmd_follow(args):
    return follow(args.inventory, run_id=args.run_id, interval=args.interval, once=args.once,
                  max_seconds=args.max_seconds)


def add_parser(sub):
    p = sub.add_parser("follow", help="print every node's tmux pane of a run live, over ssh")
    p.add_argument("-i", "--inventory", default="inventory/local", help="inventory folder or file")
    p.add_argument("--run-id", default=None, help="run to follow (default: the master's last run)")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    p.add_argument("--once", action="store_true", help="print the panes once and exit")
    p.add_argument("--max-seconds", type=float, default=None, help="stop following after this long")
    p.set_defaults(func=cmd_follow)
