"""Find (and with --kill end) a ddplab lab's rank processes and the listener of a port; JSON out.

A process is the lab's when its environment has DDPLAB_ROOT=<root> (every rank launched by ddplab),
or when its command line runs torchrun / torch.distributed.run / trainer and names the lab folder
(leftovers started by hand). Orphans (PPID 1) are found the same way. Killing is by PID: SIGTERM,
wait, then SIGKILL. Standard library only.
"""

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import time


def read(path, mode="rb"):
    try:
        with open(path, mode) as f:
            return f.read()
    except OSError:
        return None


def proc_info(pid):
    cmd = read(f"/proc/{pid}/cmdline")
    stat = read(f"/proc/{pid}/stat")
    if not cmd or stat is None:
        return None
    ppid = int(stat.rsplit(b")", 1)[1].split()[1])
    env = read(f"/proc/{pid}/environ") or b""
    envd = dict(e.split(b"=", 1) for e in env.split(b"\0") if b"=" in e)
    return {"pid": pid, "ppid": ppid, "cmd": cmd.replace(b"\0", b" ").decode(errors="replace").strip(),
            "root": envd.get(b"DDPLAB_ROOT", b"").decode(errors="replace"),
            "run": envd.get(b"DDPLAB_RUN_ID", b"").decode(errors="replace")}


RANK_CMD = re.compile(r"torchrun|torch\.distributed\.run|-m trainer\b|trainer/")


def lab_processes(root, run_id):
    me = {os.getpid(), os.getppid()}
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in me:
            continue
        info = proc_info(int(name))
        if info is None:
            continue
        if info["root"] == root:
            why = "ddplab rank of this lab"
        elif RANK_CMD.search(info["cmd"]) and (root + "/") in info["cmd"]:
            why = "torchrun/trainer command in this lab folder"
        else:
            continue
        if run_id and info["run"] != run_id:
            continue
        if info["ppid"] == 1:
            why += " (orphan, PPID 1)"
        info["why"] = why
        found.append(info)
    return found


def port_holders(port):
    out = subprocess.run(["ss", "-Htlnp", f"sport = :{port}"], capture_output=True, text=True, check=False)
    pids = sorted({int(p) for p in re.findall(r"pid=(\d+)", out.stdout)})
    holders = []
    for pid in pids:
        info = proc_info(pid) or {"pid": pid, "ppid": 0, "cmd": "?", "root": "", "run": ""}
        info["why"] = f"listening on master port {port}"
        holders.append(info)
    return holders


def alive(pid):
    stat = read(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def kill_all(pids, grace):
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            time.sleep(0.1)
        pids = [p for p in pids if alive(p)]
        if not pids:
            break
    return pids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port", default="")
    ap.add_argument("--run-id", default="")
    ap.add_argument("--grace", type=float, default=5)
    ap.add_argument("--kill", action="store_true")
    args = ap.parse_args()
    root = os.path.abspath(args.root).rstrip("/")
    procs = lab_processes(root, args.run_id)
    if args.port:
        seen = {p["pid"] for p in procs}
        procs += [h for h in port_holders(args.port) if h["pid"] not in seen]
    result = {"found": procs, "killed": [], "survivors": []}
    if args.kill and procs:
        survivors = kill_all([p["pid"] for p in procs], args.grace)
        result["survivors"] = survivors
        result["killed"] = [p for p in procs if p["pid"] not in survivors]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
