"""The scaling lab: is a second machine worth it? Measured on simulated hosts with a shaped link.

    sudo .venv/bin/python bench/scaling_lab.py [--nodes 2] [--rate 1gbit] [--sizes small,large,...] [--id ID]

Runs the same model and per-rank batch as
  1x1       1 node x 1 rank: simlan node0 (pinned to one core), one thread
  1x2       1 node x 2 ranks: this machine (2 cores, loopback), one thread per rank
  Nx1-<comm> N nodes x 1 rank: simlan node0..N-1, each pinned to its own core (--cpus auto), link shaped
            to --rate, one thread per rank; fp32 and each --comm option (small model), fp32 and auto (large)
probes the link with `python -m nodeprobe gloo-smoke` on every node, and writes into runs/bench-<id>/:
raw/ (each node's trainer out dir), probe/, meta.json, then report.md, report.json, scaling.png,
loss.png and tradeoff.png (where validation losses were compared; bench/scaling_report.py; rebuild
with `python bench/scaling_report.py runs/bench-<id>`), and
copies the report to bench/results/scaling_lab/. Every configuration runs once per round, --repeat
rounds (3 by default), interleaved; every round is kept, and the report gives medians with min-max and
takes each ratio within a round (bench/scaling_report.py): other work on the machine shares the cores,
and the spread says how much it moved the figures.

Launch (--via): `exec` (default) starts one torchrun per host with simlan's exec (nsenter), with the
flags the launch role would render; `ansible` runs the N-node runs through the orchestrator
(`ansible-playbook -i inventory/simlan playbooks/launch.yml -e ddplab_wait=true ...`) and copies the
collected out dirs from runs/<run id>/<host>/out.
The simlan cluster is created when none is up and taken down at the end (one that was already up with
the same shape is reused and left up). Needs root (simlan).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import scaling_report  # noqa: E402
from run_labels import LOCAL, comm_flags  # noqa: E402

SIZES = {
    # ~10M parameters (nanoGPT's shakespeare-char shape)
    "small": {"model": ["--depth", "6", "--n-embd", "384", "--n-head", "6", "--seq-len", "128",
                        "--batch-size", "8", "--auto-trial-steps", "3"], "steps": 20, "warmup": 2,
              "comms": ["fp32", "bf16", "fp16", "powersgd", "auto"], "repeat": 3},
    # the same model with 4x the tokens per step (4,096 per rank): the all-reduce is the same 43 MB, the
    # compute 4x longer; shows how the answer to "is a second machine worth it" depends on the batch
    "small-b32": {"model": ["--depth", "6", "--n-embd", "384", "--n-head", "6", "--seq-len", "128",
                            "--batch-size", "32", "--auto-trial-steps", "3"], "steps": 10, "warmup": 2,
                  "comms": ["fp32", "auto"], "auto_steps": 18, "repeat": 3},
    # the field notes' 126M-like d8 shape: depth 8, width 1152 (128M parameters, 512 MB of fp32 gradients)
    "large": {"model": ["--depth", "8", "--n-embd", "1152", "--n-head", "18", "--seq-len", "128",
                        "--batch-size", "4", "--lr", "1e-3", "--auto-trial-steps", "3"],
              "steps": 6, "warmup": 1,
              "comms": ["fp32", "auto"], "auto_steps": 15, "repeat": 3},
    # the same model with one sequence per rank: a step's compute (~2.5 s on one core here) is shorter than
    # its fp32 all-reduce at 1 Gbit/s (512 MB: >= 4.1 s), the communication-bound case of the field notes
    "large-b1": {"model": ["--depth", "8", "--n-embd", "1152", "--n-head", "18", "--seq-len", "128",
                           "--batch-size", "1", "--lr", "1e-3", "--auto-trial-steps", "3"],
                 "steps": 6, "warmup": 1, "comms": ["fp32", "auto"], "auto_steps": 15, "repeat": 3},
    # large-b1 in the low-communication mode: one fp32 parameter sync per 16 steps (local16) against the
    # per-step fp32 all-reduce, the same 16 steps each, so their validation losses are at equal tokens
    # (16 held-out sequences: 8 batches of one sequence would be a noisy yardstick)
    "large-b1-local": {"model": ["--depth", "8", "--n-embd", "1152", "--n-head", "18", "--seq-len", "128",
                                 "--batch-size", "1", "--lr", "1e-3", "--eval-batches", "16"],
                       "steps": 16, "warmup": 1, "comms": ["fp32", "local16"], "repeat": 3},
    # the same at 96 steps (6 to 24 syncs; the cosine schedule decays to the end): how the loss gap and the
    # speed move with H, 16-bit syncs and plain averaging vs DiLoCo. Validation reference: 1x2 (fp32, the
    # same optimization as 2x1-fp32 without the 5 s/step link wait), e.g. run once with --runs 1x2
    "large-b1-long": {"model": ["--depth", "8", "--n-embd", "1152", "--n-head", "18", "--seq-len", "128",
                                "--batch-size", "1", "--lr", "1e-3", "--eval-batches", "16"],
                      "steps": 96, "warmup": 2,
                      "comms": ["local4-bf16-avg", "local8-bf16-avg", "local16-bf16-avg", "local16-avg",
                                "local16-bf16"], "repeat": 3},
}
COMMON = ["--threads", "1", "--log-every", "1", "--powersgd-start-step", "2", "--pg-timeout-s", "600",
          "--check-every", "0"]
MASTER_PORT = 29611
RUN_TIMEOUT_S = 1800


class BenchError(RuntimeError):
    pass


def run_in_hosts(cluster, argv_for, names, log_dir: Path, timeout: float = RUN_TIMEOUT_S) -> None:
    """Start argv_for(i) inside each simlan host at once; wait for all; raise BenchError naming the failed
    node with its log's tail (logs in log_dir/<host>.log). Also used by bench/hetero.py."""
    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, name in enumerate(names):
        log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 (closed below)
        p = cluster.popen(name, argv_for(i), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        procs.append((name, log, p))
    deadline = time.monotonic() + timeout
    failed = []
    for name, log, p in procs:
        try:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        log.close()
        if p.returncode != 0:
            failed.append(f"{name} exit {p.returncode} (log {log_dir / (name + '.log')}: "
                          f"{(log_dir / (name + '.log')).read_text()[-400:].strip()})")
    if failed:
        raise BenchError("; ".join(failed))


def rate_bps(rate: str | None) -> float | None:
    if not rate:
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]?)bit", rate.strip().lower())
    if not m:
        raise BenchError(f"--rate {rate!r}: use tc's form, e.g. 1gbit or 100mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]


def machine_info() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    info = {"logical_cpus": os.cpu_count(), "physical_cores": None, "load_before": None, "cpu": None,
            "torch": None}
    with contextlib.suppress(PackageNotFoundError):
        info["torch"] = version("torch")
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), None)
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu", "-p=CORE,SOCKET"], capture_output=True, text=True, timeout=10).stdout
        info["physical_cores"] = len({ln for ln in out.splitlines() if ln and not ln.startswith("#")})
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def env_for(threads: int = 1) -> dict:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                           "MASTER_PORT", "LOCAL_WORLD_SIZE")}
    return e | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}


def node_env(threads: int = 1) -> list[str]:
    """`env ...` prefix for a command inside a simlan host (exec gives it a login environment)."""
    return ["env", f"PYTHONPATH={REPO}", f"OMP_NUM_THREADS={threads}", f"MKL_NUM_THREADS={threads}",
            "PYTHONUNBUFFERED=1", "GLOO_SOCKET_IFNAME=eth0", "TORCH_CPP_LOG_LEVEL=ERROR"]


class Lab:
    def __init__(self, args):
        self.args = args
        venv = REPO / ".venv" / "bin" / "python"
        self.py = str(venv) if venv.exists() else sys.executable
        self.bench = REPO / "runs" / f"bench-{args.id}"
        self.cluster = None
        self.made_cluster = False

    # --- cluster --------------------------------------------------------------------------------------
    def up(self):
        from simlan import cluster as simlan

        cur = simlan.load()
        want = (self.args.nodes, self.args.rate, "auto")
        n, pct = self.args.nodes, self.args.node_cpu
        quota = [f"node{i}={pct}" for i in range(n)] if pct else []  # a quota'd cluster is always new
        if cur is not None and (len(cur.hosts), cur.rate, cur.cpus) == want and cur.healthy() and not quota:
            self.cluster = cur
            return
        if cur is not None and not self.args.force:
            raise BenchError(f"a simlan cluster of another shape is up ({len(cur.hosts)} hosts, rate "
                             f"{cur.rate}, cpus {cur.cpus}), maybe another engineer's tests; wait for it or "
                             f"add --force to recreate it")
        self.cluster = simlan.up(n, rate=self.args.rate, cpus="auto", force=True, cpu_quota=quota)
        self.made_cluster = True

    def down(self):
        if self.made_cluster and not self.args.keep_cluster:
            from simlan import cluster as simlan

            simlan.down()

    def node_cores(self, name: str) -> int:
        r = self.cluster.exec(name, [self.py, "-c", "import os; print(len(os.sched_getaffinity(0)))"],
                              timeout=60)
        return int(r.stdout.strip()) if r.returncode == 0 else None

    # --- runs ---------------------------------------------------------------------------------------------
    def run_nodes(self, argv_for, names, log_dir: Path, timeout=RUN_TIMEOUT_S):
        run_in_hosts(self.cluster, argv_for, names, log_dir, timeout)

    def trainer_run(self, size: str, label: str, nodes: int, per_node: int, comm: str, steps: int,
                    attempt: int = 0):
        """One run into raw/<size>/<label>/round<attempt>/ (every round is kept; the report summarizes)."""
        if self.args.runs and label not in self.args.runs:
            return
        spec = SIZES[size]
        rdir = self.bench / "raw" / size / label / f"round{attempt}"
        if rdir.exists():
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        base = ["-m", "trainer", "--data", str(self.data), "--steps", str(steps), *spec["model"], *COMMON,
                "--timing-warmup-steps", str(spec["warmup"]), *comm_flags(comm),
                "--run-id", f"{self.args.id}-{label}"]
        run = {"nodes": nodes, "ranks_per_node": per_node, "comm": comm, "steps": steps,
               "load_before": load()}
        t0 = time.monotonic()
        print(f"[{time.strftime('%H:%M:%S')}] {size} {label}: {nodes} node(s) x {per_node} rank(s), "
              f"--comm {comm}, {steps} steps, load {run['load_before']}", flush=True)
        if nodes == 1 and per_node == 1:
            run.update(where="simlan node0", cores_per_node=self.node_cores("node0"))
            self.run_nodes(lambda i: [*node_env(), self.py, *base, "--out", str(rdir / "node0")],
                           ["node0"], rdir / "logs")
        elif nodes == 1:
            run.update(where="this machine (loopback)", cores_per_node=len(os.sched_getaffinity(0)),
                       rank0_dir="local")
            cmd = [self.py, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={per_node}",
                   *base, "--out", str(rdir / "local")]
            (rdir / "logs").mkdir()
            with open(rdir / "logs" / "local.log", "w") as log:
                p = subprocess.run(cmd, cwd=REPO, env=env_for(), stdout=log, stderr=subprocess.STDOUT,
                                   timeout=RUN_TIMEOUT_S)
            if p.returncode != 0:
                raise BenchError(f"{label} exit {p.returncode}: see {rdir / 'logs' / 'local.log'}")
        elif self.args.via == "ansible":
            names = [f"node{i}" for i in range(nodes)]
            run.update(where=f"simlan {','.join(names)} via playbooks/launch.yml",
                       cores_per_node=self.node_cores("node0"))
            self.ansible_run(base, rdir, f"bench-{self.args.id}-{size}-{label}-t{attempt}", steps)
        else:
            names = [f"node{i}" for i in range(nodes)]
            run.update(where=f"simlan {','.join(names)}", cores_per_node=self.node_cores("node0"))
            master = self.cluster.host("node0").addr

            def argv(i):
                return [*node_env(), self.py, "-m", "torch.distributed.run", f"--nnodes={nodes}",
                        f"--node-rank={i}", "--nproc-per-node=1", f"--master-addr={master}",
                        f"--master-port={MASTER_PORT}", "--rdzv-conf=timeout=120", "--max-restarts=0",
                        *base, "--out", str(rdir / names[i])]

            self.run_nodes(argv, names, rdir / "logs")
        run.update(wall_s=round(time.monotonic() - t0, 1), load_after=load())
        s = json.loads((rdir / run.get("rank0_dir", "node0") / "summary.json").read_text())
        # the report needs metrics and summaries only; a 128M run's final checkpoints (model and AdamW
        # state of every rank: ~1.5 GB per node) would fill the disk over a lab's dozens of runs
        for ckpt in rdir.glob("*/ckpt"):
            shutil.rmtree(ckpt)
        run["round"] = attempt
        (rdir / "run.json").write_text(json.dumps(run, indent=2) + "\n")
        print(f"    -> {s['tokens_per_sec']:.1f} tok/s, step p50 {s['step_ms_p50']:.0f} ms, all-reduce p50 "
              f"{s['allreduce_ms_p50']:.0f} ms, comm {s.get('comm_chosen')}, {run['wall_s']} s "
              f"(round {attempt})", flush=True)

    def ansible_run(self, base: list[str], rdir: Path, run_id: str, steps: int):
        """One N-node run through the orchestrator (prepare, preflight, start, wait, collect), its
        collected out dirs copied to rdir/<host>/."""
        flags = list(base[2:])  # after "-m trainer"
        drop = {"--data": 1, "--steps": 1, "--depth": 1, "--run-id": 1, "--threads": 1, "--pg-timeout-s": 1}
        extra, i = [], 0
        while i < len(flags):
            if flags[i] in drop:
                i += 2
                continue
            extra.append(flags[i])
            i += 1
        depth = base[base.index("--depth") + 1]
        ev = {"ddplab_wait": True, "ddplab_run_id": run_id, "ddplab_data_dir": str(self.data),
              "ddplab_trainer_steps": steps, "ddplab_trainer_depth": int(depth),
              "ddplab_trainer_extra_args": extra, "ddplab_threads": 1, "ddplab_pg_timeout": 600,
              "ddplab_master_port": MASTER_PORT}
        cmd = [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.cluster.inventory_dir),
               "playbooks/launch.yml", "-e", json.dumps(ev)]
        (rdir / "logs").mkdir(parents=True, exist_ok=True)
        with open(rdir / "logs" / "ansible.log", "w") as log:
            p = subprocess.run(cmd, cwd=REPO, env=env_for(), stdout=log, stderr=subprocess.STDOUT,
                               timeout=RUN_TIMEOUT_S)
        if p.returncode != 0:
            raise BenchError(f"ansible-playbook launch.yml exited {p.returncode}: see "
                             f"{rdir / 'logs' / 'ansible.log'}")
        collected = REPO / "runs" / run_id
        for host in sorted(d for d in collected.iterdir() if d.is_dir()):
            if (host / "out").is_dir():
                shutil.copytree(host / "out", rdir / host.name)
                for extra_file in ("launch.log", "pane.txt"):
                    if (host / extra_file).exists():
                        shutil.copy2(host / extra_file, rdir / "logs" / f"{host.name}.{extra_file}")

    def probe(self):
        pdir = self.bench / "probe"
        pdir.mkdir(parents=True, exist_ok=True)
        names = [f"node{i}" for i in range(self.args.nodes)]
        master = self.cluster.host("node0").addr

        def argv(i):
            return [*node_env(), self.py, "-m", "nodeprobe", "gloo-smoke", "--rank", str(i), "--world",
                    str(len(names)), "--master-addr", master, "--master-port", str(MASTER_PORT + 1),
                    "--ifname", "eth0", "--mb", str(self.args.probe_mb), "--reps", "5", "--timeout", "60"]

        self.run_nodes(argv, names, pdir / "logs", timeout=600)
        for i, name in enumerate(names):
            log = (pdir / "logs" / f"{name}.log").read_text()
            lines = [ln for ln in log.splitlines() if ln.startswith("{")]
            (pdir / f"gloo_smoke.rank{i}.json").write_text((lines[-1] if lines else "{}") + "\n")
        p = json.loads((pdir / "gloo_smoke.rank0.json").read_text())
        print(f"[{time.strftime('%H:%M:%S')}] link probe: {json.dumps(p.get('bandwidth') or p.get('error'))}",
              flush=True)

    def main(self):
        a = self.args
        from trainer.data.shards import prepare

        self.bench.mkdir(parents=True, exist_ok=True)
        machine = machine_info() | {"load_before": load()}
        via = ("simlan exec + torchrun (not the Ansible playbooks)" if a.via == "exec" else
               "playbooks/launch.yml on the simlan inventory (1 node runs: simlan exec / this machine)")
        meta_file = self.bench / "meta.json"
        old = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        if old and (old.get("nodes"), old.get("rate"), old.get("node_cpu")) != (a.nodes, a.rate, a.node_cpu):
            raise BenchError(f"{self.bench} holds runs with {old.get('nodes')} nodes at {old.get('rate')} "
                             f"(node CPU {old.get('node_cpu') or 100} %); use another --id")
        call = {"sizes": a.sizes, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "load_before": load()}
        meta = {"id": a.id, "nodes": a.nodes, "rate": a.rate, "rate_bps": rate_bps(a.rate), "via": via,
                "node_cpu": a.node_cpu,
                "machine": old.get("machine", machine),
                "sizes": old.get("sizes", {}) | {s: SIZES[s] for s in a.sizes},
                "invocations": old.get("invocations", []) + [call]}
        (self.bench / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        self.data = self.bench / "data"
        if not (self.data / "manifest.json").exists():
            prepare(self.data, None, 2048, 64, 8, seed=0)
        self.up()
        try:
            self.probe()
            n = a.nodes
            for size in a.sizes:
                spec = SIZES[size]
                comms = spec["comms"] if a.comms is None else a.comms
                steps = spec["steps"] if a.steps is None else a.steps
                # rounds: every configuration once per round, so a busy spell of the machine hits all alike
                for attempt in range(spec["repeat"] if a.repeat is None else a.repeat):
                    self.trainer_run(size, "1x1", 1, 1, "fp32", steps, attempt)
                    self.trainer_run(size, "1x2", 1, 2, "fp32", steps, attempt)
                    for comm in comms:
                        self.trainer_run(size, f"{n}x1-{comm}", n, 1, comm,
                                         spec.get("auto_steps", steps) if comm == "auto" else steps, attempt)
        finally:
            meta["machine"]["load_after"] = call["load_after"] = load()
            (self.bench / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            self.down()
        rep = scaling_report.build(scaling_report.collect(self.bench))
        scaling_report.write(rep, self.bench)
        print(scaling_report.markdown(rep))
        results = REPO / a.results  # the latest lab of this kind, beside the other benches
        results.mkdir(parents=True, exist_ok=True)
        for name in ("report.md", "report.json", "scaling.png", "loss.png", "tradeoff.png"):
            if (self.bench / name).exists():
                shutil.copy2(self.bench / name, results / name)
        print(f"wrote {self.bench}/report.md, report.json and the plots (copied to {results})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2, help="simulated nodes for the N x 1 runs")
    ap.add_argument("--rate", default="1gbit", help="link rate (tc tbf), e.g. 1gbit, 100mbit")
    ap.add_argument("--sizes", default="small,small-b32,large,large-b1",
                    help=f"comma list of {', '.join(SIZES)}")
    ap.add_argument("--comms", default=None, help="comma list of --comm options for the N-node runs, "
                    "or local<H> for the low-communication mode (default: per size)")
    ap.add_argument("--steps", type=int, default=None, help="steps per run (default: per size)")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (every configuration once per round; "
                    "default: per size, 3)")
    ap.add_argument("--probe-mb", type=float, default=64.0, help="all-reduce size of the link probe")
    ap.add_argument("--node-cpu", type=int, default=None, metavar="PCT",
                    help="each simulated node at PCT %% of its core (simlan --cpu-quota), leaving the rest "
                    "of the core to the kernel's work for the simulated link, as a real NIC would")
    ap.add_argument("--id", default=time.strftime("%Y%m%d-%H%M%S"))
    ap.add_argument("--runs", default=None, help="comma list of run labels to do (e.g. 1x1,2x1-auto); "
                    "default: all")
    ap.add_argument("--via", choices=("exec", "ansible"), default="exec",
                    help="how the N-node runs start: exec = simlan exec + torchrun on each host (default); "
                    "ansible = playbooks/launch.yml -e ddplab_wait=true on the simlan inventory")
    ap.add_argument("--results", default="bench/results/scaling_lab",
                    help="where (relative to the repository) the report is copied at the end")
    ap.add_argument("--force", action="store_true", help="recreate a simlan cluster of another shape")
    ap.add_argument("--keep-cluster", action="store_true", help="leave the cluster up at the end")
    a = ap.parse_args(argv)
    a.sizes = [s for s in a.sizes.split(",") if s]
    bad = [s for s in a.sizes if s not in SIZES]
    if bad or a.nodes < 2:
        print(f"ddplab: error: --sizes takes {', '.join(SIZES)} (got {', '.join(bad)}) and --nodes at "
              f"least 2", file=sys.stderr)
        return 2
    a.comms = a.comms.split(",") if a.comms else None
    from trainer.config import COMM_CHOICES

    wrong = [c for c in a.comms or () if c not in COMM_CHOICES and not LOCAL.fullmatch(c)]
    if wrong:
        print(f"ddplab: error: --comms takes {', '.join(COMM_CHOICES)} or local<H>[-bf16][-avg][-ovl][-f<F>] "
              f"(e.g. local8, local16-bf16-avg), got {', '.join(wrong)}", file=sys.stderr)
        return 2
    a.runs = set(a.runs.split(",")) if a.runs else None
    from simlan.errors import SimlanError

    def stop(signum, frame):  # SIGTERM: unwind, so the cluster this bench made is taken down
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        rate_bps(a.rate)
        Lab(a).main()
    except (BenchError, SimlanError) as e:
        print(f"ddplab: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the cluster is down (Lab.main's finally); rounds kept
        print(f"ddplab: interrupted; the finished runs stay in runs/bench-{a.id}/raw (rebuild the report "
              f"with `python bench/scaling_report.py runs/bench-{a.id}`)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
