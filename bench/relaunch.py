"""Relaunch cost: `launch.yml -e ddplab_wait=true` of a short run on a prepared cluster, side by side
with starting the same ranks by hand over ssh + tmux, at 2 and at 8 simulated hosts.

    .venv/bin/python bench/relaunch.py [--hosts 2 8] [--rounds 3] [--steps 3]

Per host count: a simlan cluster is brought up (root hosts), prepared once by a full launch, then each
round runs, interleaved: (a) `ansible-playbook -i <inv> playbooks/launch.yml -e ddplab_wait=true
-e ddplab_trainer_steps=N` (the whole command: plan, checks and prepare where the nodes' records say
they are needed (none on this unchanged lab), start, wait, collect, outcome), (b)
the bare way: over ssh to every host at once, `tmux new-session -d` running the same torchrun command
line (same Python, code, shards, GLOO_SOCKET_IFNAME, steps, model depth, 1 thread per rank), then ssh polls
until every rank wrote its exit code, and (c) a no-change `prepare.yml`. Both ways train with 1 thread per
rank (`-e ddplab_threads=1`): the simulated hosts share this machine's 2 cores, and ddplab's default (the
node's CPUs per rank) would oversubscribe them and time a different training run than the bare way's.
Wall times are medians of the rounds with min-max; the ratio launch/bare is taken within each round,
then summarized. Writes bench/results/relaunch/report.json, report.md and relaunch.png (and prints the
table).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "results" / "relaunch"
ANSIBLE = str(REPO / ".venv" / "bin" / "ansible-playbook")
# What launch.yml is given so that it trains the same run as bare_run (depth 2 is the trainer default).
SAME_RUN = ("-e", "ddplab_wait=true", "-e", "ddplab_threads=1", "-e", "ddplab_trainer_depth=2")
RECAP = re.compile(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
HEADER = re.compile(r"^TASK \[", re.M)


class BenchError(Exception):
    pass


def playbook(inv: Path, name: str, *extra: str, log: Path) -> tuple[float, dict]:
    """Wall seconds of one ansible-playbook command, and its recap {host: (ok, changed)} (with "TASK": the
    task headers it printed)."""
    t0 = time.perf_counter()
    p = subprocess.run([ANSIBLE, "-i", str(inv), f"playbooks/{name}", *extra], cwd=REPO,
                       capture_output=True, text=True, timeout=1800, check=False)
    dt = time.perf_counter() - t0
    log.write_text(p.stdout + p.stderr)
    if p.returncode != 0:
        raise BenchError(f"{name} {' '.join(extra)} exited {p.returncode}; see {log}")
    return dt, {m[0]: (int(m[1]), int(m[2])) for m in RECAP.findall(p.stdout)} | {
        "TASK": (len(HEADER.findall(p.stdout)), 0)}


def bare_run(cluster, steps: int, run_id: str, lab: str = "/root/ddplab") -> float:
    """Start one rank per host over ssh in tmux, wait until every exit code is there; wall seconds."""
    names = [h.name for h in cluster.hosts]
    master = cluster.hosts[0].addr
    run_dir = f"{lab}/runs/{run_id}"
    t0 = time.perf_counter()
    procs = []
    for rank, name in enumerate(names):
        torchrun = (f'"$(cat {lab}/python)" -m torch.distributed.run --nnodes {len(names)} '
                    f"--nproc-per-node 1 --node-rank {rank} --master-addr {master} --master-port 29500 "
                    "--rdzv-conf timeout=60 "
                    f"-m trainer --data {lab}/data --out {run_dir}/out --run-id {run_id} --steps {steps} "
                    f"--depth 2 --threads 1")
        script = (f"mkdir -p {run_dir} && cd {run_dir} && GLOO_SOCKET_IFNAME=eth0 OMP_NUM_THREADS=1 "
                  f"PYTHONPATH={lab}/code {torchrun} > launch.log 2>&1; echo $? > exit_code")
        cmd = f"tmux -S {lab}/bare.sock new-session -d -s {run_id} {shlex.quote(script)}"
        procs.append(subprocess.Popen(cluster.ssh_argv(name, cmd)))
    for p in procs:
        if p.wait(timeout=60) != 0:
            raise BenchError("bare start over ssh failed")
    pending = set(names)
    deadline = time.monotonic() + 600
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            r = subprocess.run(cluster.ssh_argv(name, f"cat {run_dir}/exit_code"), capture_output=True,
                               text=True, check=False)
            if r.returncode == 0 and r.stdout.strip():
                if r.stdout.strip() != "0":
                    raise BenchError(f"bare run on {name} exited {r.stdout.strip()}")
                pending.discard(name)
        if pending:
            time.sleep(0.5)
    if pending:
        raise BenchError(f"bare run still running on {sorted(pending)}")
    return time.perf_counter() - t0


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def bench_hosts(n: int, rounds: int, steps: int, logs: Path) -> dict:
    from simlan import cluster as simlan

    cluster = simlan.up(n, force=True)
    inv = Path(cluster.inventory_dir)
    try:
        playbook(inv, "launch.yml", *SAME_RUN, "-e", f"ddplab_trainer_steps={steps}",
                 log=logs / f"h{n}-first.log")
        launch, bare, prep, ratio, prep_changed, tasks, load = [], [], [], [], [], 0, []
        for i in range(rounds):
            load.append(round(os.getloadavg()[0], 1))  # the machine's 1-min load as the round starts
            t_launch, recap = playbook(inv, "launch.yml", *SAME_RUN, "-e", f"ddplab_trainer_steps={steps}",
                                       log=logs / f"h{n}-launch{i}.log")
            t_bare = bare_run(cluster, steps, f"bare-{n}-{i}-{int(time.time())}")
            t_prep, prep_recap = playbook(inv, "prepare.yml", log=logs / f"h{n}-prepare{i}.log")
            launch.append(t_launch)
            bare.append(t_bare)
            prep.append(t_prep)
            ratio.append(t_launch / t_bare)
            prep_changed.append(sum(c for _, c in prep_recap.values()))
            headers = recap.pop("TASK")[0]
            tasks = max(ok for ok, _ in recap.values())
            print(f"  {n} hosts round {i + 1}: launch {t_launch:.1f} s, bare {t_bare:.1f} s "
                  f"(x{t_launch / t_bare:.2f}), no-change prepare {t_prep:.1f} s changed={prep_changed[-1]}, "
                  f"load {load[-1]}", flush=True)
        return {"hosts": n, "steps": steps, "launch_s": spread(launch), "bare_s": spread(bare),
                "ratio": spread(ratio), "prepare_nochange_s": spread(prep), "prepare_changed": prep_changed,
                "launch_tasks_per_host_max": tasks, "launch_task_headers": headers, "load_1min": load}
    finally:
        simlan.down()


def write(results: list[dict]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "report.json").write_text(json.dumps({"results": results, "load": os.getloadavg(),
                                                 "cpus": os.cpu_count()}, indent=2) + "\n")
    lines = ["# Relaunch on a prepared cluster: launch.yml vs bare ssh + tmux", "",
             "Medians of interleaved rounds, [min-max]; ratio per round, then its median.", "",
             "| hosts | launch.yml -e ddplab_wait=true (s) | bare ssh+tmux (s) | ratio "
             "| no-change prepare.yml (s) |",
             "|---|---|---|---|---|"]
    for r in results:
        def f(d):
            return f"{d['median']:.1f} [{d['min']:.1f}-{d['max']:.1f}]"
        lines.append(f"| {r['hosts']} | {f(r['launch_s'])} | {f(r['bare_s'])} | "
                     f"{r['ratio']['median']:.2f} [{r['ratio']['min']:.2f}-{r['ratio']['max']:.2f}] | "
                     f"{f(r['prepare_nochange_s'])} (changed {max(r['prepare_changed'])}) |")
    (OUT / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["hosts"] for r in results]
    for key, label in (("launch_s", "launch.yml (wait)"), ("bare_s", "bare ssh+tmux"),
                       ("prepare_nochange_s", "no-change prepare.yml")):
        med = [r[key]["median"] for r in results]
        err = [[m - r[key]["min"] for m, r in zip(med, results, strict=True)],
               [r[key]["max"] - m for m, r in zip(med, results, strict=True)]]
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=4, label=label)
    ax.set_xlabel("simulated hosts")
    ax.set_ylabel("wall seconds (median, min-max)")
    ax.set_xticks(xs)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(OUT / "relaunch.png", dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, nargs="+", default=[2, 8])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench/relaunch.py: error: needs root (simlan hosts)", file=sys.stderr)
        return 2
    logs = REPO / "runs" / f"bench-relaunch-{time.strftime('%Y%m%d-%H%M%S')}"
    logs.mkdir(parents=True, exist_ok=True)
    results = []
    try:
        for n in a.hosts:
            results.append(bench_hosts(n, a.rounds, a.steps, logs))
            write(results)  # each host count as soon as it is measured: a later failure keeps it
    except (BenchError, subprocess.TimeoutExpired) as e:
        print(f"bench/relaunch.py: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
