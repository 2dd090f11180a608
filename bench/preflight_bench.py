"""Preflight wall time on simulated hosts (not a test): healthy 2- and 4-host clusters, and for each
field-notes fault (injected alone into one host of the 2-host cluster) the time to a verdict.

    sudo SIMLAN_LAB=1 .venv/bin/python bench/preflight_bench.py [--reps 2] [--skip-4]

Prints a table and writes bench/results/preflight.json (with the machine's load average, which
dominates these numbers on a shared 2-core box). Targets (issue 4): healthy 2 hosts <= 20 s, any
fault <= 30 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from simlan import cluster as simlan  # noqa: E402

BIN = Path(sys.executable).parent
PORT = 29500
DATA = "/root/ddplab/data"


def playbook(name: str, inv: Path, extra: dict, *args: str, timeout: float = 600):
    argv = [str(BIN / "ansible-playbook"), f"playbooks/{name}", "-i", str(inv), *args]
    for k, v in extra.items():
        argv += ["-e", f"{k}={v}"]
    t0 = time.monotonic()
    p = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                       env={**os.environ, "ANSIBLE_NOCOLOR": "1"}, stdin=subprocess.DEVNULL)
    return p, time.monotonic() - t0


def sh(c, host: str, script: str, input: str | None = None) -> str:
    out = c.exec(host, ["bash", "-c", script], timeout=60, input=input)
    if out.returncode != 0:
        raise SystemExit(f"bench: {host}: {script}: {out.stderr.strip()}")
    return out.stdout


def host_vars_inventory(c, base: Path, values: dict) -> Path:
    inv = base / "inv-hostvars"
    if inv.exists():
        subprocess.run(["rm", "-rf", str(inv)], check=True)
    inv.mkdir(parents=True)
    (inv / "hosts.yml").write_text((c.inventory_dir / "hosts.yml").read_text())
    subprocess.run(["cp", "-r", str(c.inventory_dir / "group_vars"), str(inv)], check=True)
    (inv / "host_vars").mkdir()
    for h, v in values.items():
        (inv / "host_vars" / f"{h}.yml").write_text(json.dumps(v))
    return inv


def faults(c, base: Path, shard: str):
    """(name, host, check, inject() -> inventory or None, restore())"""
    a0, a1 = c.host("node0").addr, c.host("node1").addr
    state: dict = {}

    def hosts_prepend(host, line):
        state[host] = sh(c, host, "cat /etc/hosts")
        sh(c, host, "cat > /etc/hosts", input=line + "\n" + state[host])

    def hosts_restore(host):
        sh(c, host, "cat > /etc/hosts", input=state[host])

    def squat():
        code = ("import socket as k,time; s=k.socket(); s.setsockopt(k.SOL_SOCKET, k.SO_REUSEADDR, 1);"
                f" s.bind(('',{PORT})); s.listen(); time.sleep(600)")
        cmd = f"setsid {sys.executable} -c \"{code}\" >/dev/null 2>&1 </dev/null & echo $!"
        state["squatter"] = sh(c, "node0", cmd).strip()
        deadline = time.monotonic() + 30
        while f":{PORT} " not in sh(c, "node0", "ss -Htln") and time.monotonic() < deadline:
            time.sleep(0.2)

    def ipv6():
        sh(c, "node1", "ip link add v6a type veth peer name v6b && ip link set v6a up && ip link set v6b up"
                       " && ip addr add 2001:db8::11/64 dev v6a nodad")
        hosts_prepend("node1", "2001:db8::11 node1")

    def ipv6_undo():
        hosts_restore("node1")
        sh(c, "node1", "ip link del v6a")

    backup = f"cp {DATA}/{shard} /tmp/{shard}.bak"
    undo_shard = f"cp /tmp/{shard}.bak {DATA}/{shard}"
    return [
        ("master inbound blocked except SSH", "node0", "tcp_master",
         lambda: sh(c, "node0", f"ufw delete allow from {a1}"),
         lambda: sh(c, "node0", f"ufw allow from {a1} comment ddplab")),
        ("worker inbound blocked", "node1", "tcp_peers",
         lambda: sh(c, "node1", f"ufw delete allow from {a0}"),
         lambda: sh(c, "node1", f"ufw allow from {a0} comment ddplab")),
        ("only the master port open", "node0", "tcp_peers",
         lambda: sh(c, "node0", f"ufw delete allow from {a1} && ufw allow {PORT}/tcp"),
         lambda: sh(c, "node0", f"ufw delete allow {PORT}/tcp && ufw allow from {a1} comment ddplab")),
        ("IPv6-only interface the hostname resolves to", "node1", "hostname", ipv6, ipv6_undo),
        ("hostname -> 127.0.1.1", "node1", "hostname",
         lambda: hosts_prepend("node1", "127.0.1.1 node1"), lambda: hosts_restore("node1")),
        ("process on the master port", "node0", "master_port", squat,
         lambda: sh(c, "node0", f"kill {state['squatter']}")),
        ("one shard changed", "node1", "data",
         lambda: sh(c, "node1", f"{backup} && printf x >> {DATA}/{shard}"),
         lambda: sh(c, "node1", undo_shard)),
        ("one extra shard", "node1", "data",
         lambda: sh(c, "node1", f"cp {DATA}/{shard} {DATA}/shard_09999.parquet"),
         lambda: sh(c, "node1", f"rm {DATA}/shard_09999.parquet")),
        ("missing shard", "node1", "data",
         lambda: sh(c, "node1", f"{backup} && rm {DATA}/{shard}"), lambda: sh(c, "node1", undo_shard)),
        ("threads above the physical cores", "node1", "threads",
         lambda: host_vars_inventory(c, base, {"node1": {"ddplab_threads": 4}}), lambda: None),
        ("bf16 forced on a CPU without it", "node1", "dtype",
         lambda: host_vars_inventory(c, base, {"node1": {"ddplab_trainer_extra_args": [
             "--dtype", "bf16", "--force-dtype"]}}), lambda: None),
        ("sshd down", "node1", "ssh", lambda: c.sshd("node1", "stop", cut=True),
         lambda: c.sshd("node1", "start")),
    ]


def run_preflight(inv: Path, extra: dict, runs: Path) -> dict:
    latest = runs / "preflight" / "latest.json"
    latest.unlink(missing_ok=True)
    p, wall = playbook("preflight.yml", inv, extra, timeout=300)
    verdict = json.loads(latest.read_text()) if latest.exists() else {}
    return {"wall_s": round(wall, 2), "rc": p.returncode,
            "failures": sorted(f"{f['host']}:{f['check']}" for f in verdict.get("failures", [])),
            "ok": bool(verdict.get("ok")), "load1": round(os.getloadavg()[0], 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2, help="healthy runs per cluster size")
    ap.add_argument("--skip-4", action="store_true", help="skip the 4-host cluster")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    shards, runs = base / "shards", base / "runs"
    subprocess.run([sys.executable, "-m", "trainer.data", "prepare", "--out", str(shards), "--docs", "512",
                    "--rows-per-group", "16", "--groups-per-shard", "4"], cwd=REPO, check=True,
                   capture_output=True, timeout=300)
    snapshot = base / "repo"  # the node-side code as of now (the working tree may change meanwhile)
    for tree in ("trainer", "nodeprobe"):
        shutil.copytree(REPO / tree, snapshot / tree, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    extra = {"ddplab_data_dir": shards, "ddplab_runs_dir": runs, "ddplab_master_port": PORT,
             "ddplab_repo_dir": snapshot}
    shard = sorted(p.name for p in shards.glob("*.parquet"))[0]
    rows, load_start = [], os.getloadavg()
    out = REPO / "bench" / "results" / "preflight.json"

    def save() -> None:  # after every row: a bench cut short still leaves its numbers
        result = {"generated": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                  "nproc": os.cpu_count(),
                  "loadavg_start": [round(x, 2) for x in load_start],
                  "loadavg_end": [round(x, 2) for x in os.getloadavg()],
                  "note": "simlan hosts pinned one CPU each (--cpus auto); machine shared with other jobs",
                  "targets_s": {"healthy_2_hosts": 20, "any_fault": 30}, "rows": rows}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")

    def add(row: dict) -> None:
        rows.append(row)
        print(row, flush=True)
        save()

    try:
        for n in ([2] if args.skip_4 else [2, 4]):
            c = simlan.up(n, cpus="auto", force=True)
            p, wall = playbook("prepare.yml", c.inventory_dir, extra)
            if p.returncode != 0:
                raise SystemExit(f"bench: prepare failed on {n} hosts:\n{p.stdout[-3000:]}")
            print(f"prepare {n} hosts: {wall:.1f} s", flush=True)
            for rep in range(args.reps):
                r = run_preflight(c.inventory_dir, extra, runs)
                add({"scenario": f"healthy {n} hosts", "rep": rep + 1, "hosts": n, "expected": None, **r})
            if n != 2:
                continue
            for name, host, check, inject, restore in faults(c, base, shard):
                inv = inject()
                inv = inv if isinstance(inv, Path) else c.inventory_dir
                try:
                    r = run_preflight(inv, extra, runs)
                finally:
                    restore()
                r["named"] = f"{host}:{check}" in r["failures"]
                add({"scenario": name, "rep": 1, "hosts": n, "expected": f"{host}:{check}", **r})
            r = run_preflight(c.inventory_dir, extra, runs)
            add({"scenario": "healthy 2 hosts after all faults removed", "rep": 1, "hosts": 2,
                 "expected": None, **r})
    finally:
        simlan.down()
    save()
    print(f"\n{'scenario':46} {'hosts':>5} {'wall_s':>7} {'rc':>3} {'load1':>6}  verdict")
    for r in rows:
        verdict = "ok" if r["ok"] else ", ".join(r["failures"]) or f"no verdict (rc {r['rc']})"
        mark = "" if r["expected"] is None else ("  [named]" if r.get("named") else "  [NOT NAMED]")
        print(f"{r['scenario']:46} {r['hosts']:>5} {r['wall_s']:>7.1f} {r['rc']:>3} {r['load1']:>6}  "
              f"{verdict}{mark}")
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
