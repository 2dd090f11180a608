"""``python -m ddplab interrupt-guard``: stop a run when the ansible-playbook that waits for it is
interrupted (Ctrl-C, SIGTERM, closed terminal).

Ansible turns SIGINT into KeyboardInterrupt and exits at once: no rescue/always section runs. So
before a launch waits, this verb (run on the control host) finds the ansible-playbook process it
runs under (its topmost ancestor whose command line names ansible-playbook), and leaves a detached
guard process (its own session, so the terminal's Ctrl-C does not reach it) that polls that PID.
When the waiting play ends normally it runs `disarm` (SIGTERM to the guard). When ansible-playbook
disappears while armed, the guard re-runs ansible-playbook's own command line (same cwd, environment,
inventory and -e settings) with the launch playbook replaced by stop.yml and `-e ddplab_run_id=RUN`,
so every rank on every node ends. Its output goes to LOG and to the terminal ansible-playbook wrote to.

    python -m ddplab interrupt-guard arm --run-id RUN --playbook-dir DIR --log FILE  # {"guard_pid": ...}
    python -m ddplab interrupt-guard disarm --pid GUARD_PID
"""

import contextlib
import json
import os
import signal
import subprocess
import time

LAUNCH_PLAYBOOKS = ("launch.yml", "start.yml")


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def ppid_of(pid):
    stat = read(f"/proc/{pid}/stat")
    return int(stat.rsplit(b")", 1)[1].split()[1]) if stat else 0


def argv_of(pid):
    return [a.decode(errors="replace") for a in read(f"/proc/{pid}/cmdline").split(b"\0") if a]


def find_playbook_process():
    """The topmost ancestor whose command line runs ansible-playbook (workers are forks of it)."""
    found, pid = None, os.getppid()
    while pid > 1:
        if any(os.path.basename(a) == "ansible-playbook" for a in argv_of(pid)[:2]):
            found = pid
        pid = ppid_of(pid)
    return found


def stop_argv(pid, playbook_dir, run_id):
    """ansible-playbook's argv with the launch playbook swapped for stop.yml, plus the run id."""
    argv, cwd = argv_of(pid), os.readlink(f"/proc/{pid}/cwd")
    wanted = {os.path.realpath(os.path.join(playbook_dir, p)) for p in LAUNCH_PLAYBOOKS}
    out, swapped = [], False
    for a in argv:
        if a.endswith((".yml", ".yaml")) and os.path.realpath(os.path.join(cwd, a)) in wanted:
            out.append(os.path.join(playbook_dir, "stop.yml"))
            swapped = True
        else:
            out.append(a)
    if not swapped:
        return None, cwd
    return out + ["-e", f"ddplab_run_id={run_id}", "-e", "ddplab_wait=false"], cwd


def environ_of(pid):
    env = {}
    for item in read(f"/proc/{pid}/environ").split(b"\0"):
        if b"=" in item:
            k, v = item.split(b"=", 1)
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def alive(pid):
    stat = read(f"/proc/{pid}/stat")
    return bool(stat) and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def guard(watch, argv, cwd, env, log_path, run_id, term_fd):
    stopping = {"disarmed": False}

    def disarm(signum, frame):
        stopping["disarmed"] = True

    signal.signal(signal.SIGTERM, disarm)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    while alive(watch) and not stopping["disarmed"]:
        time.sleep(0.3)
    if stopping["disarmed"]:
        return 0
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the stop must finish
    head = (f"\nddplab: the wait for run {run_id} was interrupted: stopping every rank on every node "
            f"(log: {log_path})\n")
    with open(log_path, "ab") as log:
        log.write(head.encode() + (" ".join(argv) + "\n").encode())
        log.flush()
        for fd in (term_fd,):
            with contextlib.suppress(OSError):
                os.write(fd, head.encode())
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)
        for line in proc.stdout:
            log.write(line)
            log.flush()
            with contextlib.suppress(OSError):
                os.write(term_fd, line)
        code = proc.wait()
        tail = (f"ddplab: run {run_id} stopped on every node\n" if code == 0 else
                f"ddplab: error: stopping run {run_id} failed (exit {code}); run playbooks/stop.yml "
                f"-e ddplab_run_id={run_id} (log: {log_path})\n")
        log.write(tail.encode())
        with contextlib.suppress(OSError):
            os.write(term_fd, tail.encode())
    return code


def arm(args):
    watch = find_playbook_process()
    if watch is None:
        print(json.dumps({"guard_pid": None, "why": "not run under ansible-playbook"}))
        return 0
    argv, cwd = stop_argv(watch, args.playbook_dir, args.run_id)
    if argv is None:
        print(json.dumps({"guard_pid": None, "why": "ansible-playbook runs no launch playbook",
                          "watching": watch}))
        return 0
    env = environ_of(watch)
    try:
        term_fd = os.open(f"/proc/{watch}/fd/2", os.O_WRONLY | os.O_APPEND)
    except OSError:
        term_fd = os.open(os.devnull, os.O_WRONLY)
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    r, w = os.pipe()
    if os.fork() > 0:  # the caller: wait for the guard's PID, print it, return at once
        os.close(w)
        pid = int(os.read(r, 64) or b"0")
        print(json.dumps({"guard_pid": pid, "watching": watch, "stop": argv}))
        return 0
    os.close(r)
    os.setsid()
    if os.fork() > 0:
        os._exit(0)
    os.write(w, str(os.getpid()).encode())
    os.close(w)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os._exit(guard(watch, argv, cwd, env, args.log, args.run_id, term_fd))


def add_parser(sub):
    p = sub.add_parser("interrupt-guard",
                       help="stop the run when the waiting ansible-playbook is interrupted")
    verbs = p.add_subparsers(dest="guard_cmd", required=True)
    a = verbs.add_parser("arm", help="leave a detached guard watching ansible-playbook; prints its PID")
    a.add_argument("--run-id", required=True)
    a.add_argument("--playbook-dir", required=True)
    a.add_argument("--log", required=True)
    d = verbs.add_parser("disarm", help="end the guard (the wait ended by itself)")
    d.add_argument("--pid", type=int, required=True)
    p.set_defaults(func=cmd_interrupt_guard)


def cmd_interrupt_guard(args):
    if args.guard_cmd == "arm":
        return arm(args)
    if args.pid > 0 and "interrupt-guard" in argv_of(args.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(args.pid, signal.SIGTERM)
        print(json.dumps({"disarmed": args.pid}))
    return 0
