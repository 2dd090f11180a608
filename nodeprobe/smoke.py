"""``gloo-smoke``: a real gloo process group across the nodes, with known values and a bandwidth figure.

Every rank runs this with the same master address/port. Phases: store (TCPStore rendezvous on the
master port), init (gloo full-mesh connect), all_reduce SUM and AVG, broadcast from 0, all_gather,
each compared exactly with the value computed in one process; then an fp32 all-reduce of ``--mb`` MB
timed a few times: bus bandwidth = 2(N-1)/N * bytes / t; then the link's jitter and loss
(nodeprobe/link_quality.py) and, when the link lost segments or jitters (and given the run's model sizes,
--model), the time of one forward and backward pass of that model on one thread: the control host weighs
the link's costs against that step.

A watchdog bounds the whole command: gloo's TCP connect ignores the process-group timeout (a dropped
SYN hangs ~140 s) and a stale listener on the master port makes a worker's store handshake hang for
minutes. After ``--timeout * 3`` seconds the watchdog prints the JSON verdict with the phase that hung
and ends the process with ``os._exit`` (the clock starts once torch is imported, which only takes
long on a busy node and gets its own allowance).

GLOO_DISABLE_CONNECTION_RETRIES is deliberately not set: in gloo's tcp transport it replaces the
connect loop (which retries refused connects until the timeout) with one plain connect, so a peer
that is a moment late to listen fails the test, while a dropped SYN still waits for the kernel's SYN
retries. It shortens nothing that matters here; the watchdog does.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import sys
import threading
import time
from datetime import timedelta

from nodeprobe import link_quality

HINTS = {
    "store": "rank could not complete the TCPStore rendezvous on the master port: master not listening, "
             "port blocked by a firewall, or another process (stale listener) holds the master port",
    "init": "gloo could not connect every pair of ranks: a firewall blocks ephemeral ports in one "
            "direction, or a rank picked the wrong interface/address family (set GLOO_SOCKET_IFNAME)",
}


IMPORT_ALLOWANCE_S = 60
STEP_REPS = 1  # timed passes of the run's model (compute_step_s), after one warm-up
STEP_BUDGET_S = 2.0
STEP_FLOPS = 2e10  # at most this much work per timed pass: ~0.2 s at 100 GFLOP/s, one thread


def cpu_jiffies() -> tuple[int, int] | None:
    """(busy, total) clock ticks of the whole machine from /proc/stat; None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
    return sum(ticks[:8]) - idle, sum(ticks[:8])  # guest time is already in user


class Smoke:
    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.phase = "start"
        self.lock = threading.Lock()
        self.finished = False
        self.armed: float | None = None
        self.out = {
            "probe": "gloo-smoke",
            "host": socket.gethostname(),
            "rank": args.rank,
            "world": args.world,
            "master": f"{args.master_addr}:{args.master_port}",
            "timeout_s": args.timeout,
            "watchdog_s": args.timeout * 3,
            "ifname": args.ifname,
            "checks": {},
        }

    def elapsed(self) -> float:
        return round(time.monotonic() - self.start, 3)

    def emit(self, **extra) -> bool:
        """Print the one JSON object, once (main thread or watchdog, whichever comes first)."""
        with self.lock:
            if self.finished:
                return False
            self.finished = True
            self.out.update(extra)
            self.out["elapsed_s"] = self.elapsed()
            sys.stdout.write(json.dumps(self.out) + "\n")
            sys.stdout.flush()
            return True

    def watchdog(self) -> None:
        # Importing torch cannot hang but is slow on a busy node: it gets its own allowance, and the
        # --timeout * 3 bound starts once torch is imported (self.armed).
        bound = self.args.timeout * 3
        while True:
            if self.finished:
                return
            now = time.monotonic()
            if self.armed is not None and now >= self.armed + bound:
                break
            if self.armed is None and now >= self.start + IMPORT_ALLOWANCE_S + bound:
                break
            time.sleep(0.1)
        if self.emit(ok=False, phase=self.phase, hung=True,
                     error=f"watchdog: no progress in phase '{self.phase}' after {self.args.timeout * 3} s",
                     hint=HINTS.get(self.phase)):
            os._exit(0)

    def run(self) -> None:
        threading.Thread(target=self.watchdog, daemon=True).start()
        try:
            self._run()
        except Exception as e:  # noqa: BLE001 - any failure is the finding
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            self.emit(ok=False, phase=self.phase, hung=False, error=f"{type(e).__name__}: {first}"[:400],
                      hint=HINTS.get(self.phase))
            os._exit(0)  # gloo threads may still block; do not wait for them
        self.emit(ok=all(c["ok"] for c in self.out["checks"].values()), phase="done", hung=False)

    def check(self, name, got, expected) -> None:
        import torch

        ok = all(torch.equal(g, e) for g, e in zip(got, expected, strict=True))
        self.out["checks"][name] = {"ok": ok}
        if not ok:
            self.out["checks"][name].update(got=[g.tolist() for g in got],
                                            expected=[e.tolist() for e in expected])

    def _run(self) -> None:
        a = self.args
        if a.ifname:
            os.environ["GLOO_SOCKET_IFNAME"] = a.ifname
        # c10d logs every failed try with a C++ stack to stderr; the JSON carries the error instead.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
        if a.stop_listener and a.rank == 0:
            self.phase = "stop_listener"
            self.out["stopped_listener"] = stop_listener(a.master_addr, a.master_port)
        self.phase = "import"
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        self.out["import_s"] = self.elapsed()
        self.armed = time.monotonic()
        self.out["torch_version"] = torch.__version__
        timeout = timedelta(seconds=a.timeout)
        self.phase = "store"
        t0 = time.perf_counter()
        store = dist.TCPStore(a.master_addr, a.master_port, a.world, is_master=(a.rank == 0),
                              timeout=timeout, wait_for_workers=False)
        self.phase = "init"
        dist.init_process_group("gloo", store=store, rank=a.rank, world_size=a.world, timeout=timeout)
        self.out["init_s"] = round(time.perf_counter() - t0, 3)
        r, w = a.rank, a.world

        self.phase = "all_reduce_sum"
        t = torch.full((4,), float(r + 1))
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        self.check("all_reduce_sum", [t], [torch.full((4,), float(w * (w + 1) // 2))])

        self.phase = "all_reduce_avg"
        t = torch.tensor([float(r + 1), 2.0 * (r + 1), 4.0 * (r + 1)])
        dist.all_reduce(t, op=dist.ReduceOp.AVG)
        mean = sum(range(1, w + 1)) / w
        self.check("all_reduce_avg", [t], [torch.tensor([mean, 2 * mean, 4 * mean])])

        self.phase = "broadcast"
        src = torch.arange(8, dtype=torch.float32) * 3 + 1
        t = src.clone() if r == 0 else torch.zeros(8)
        dist.broadcast(t, src=0)
        self.check("broadcast", [t], [src])

        self.phase = "all_gather"
        mine = torch.arange(4, dtype=torch.float32) + 100 * r
        gathered = [torch.empty(4) for _ in range(w)]
        dist.all_gather(gathered, mine)
        self.check("all_gather", gathered, [torch.arange(4, dtype=torch.float32) + 100 * i for i in range(w)])

        self.phase = "bandwidth"
        numel = max(1, int(a.mb * (1 << 20)) // 4)
        buf = torch.ones(numel, dtype=torch.float32)
        dist.all_reduce(buf)  # warm-up: first use of the pairs' buffers
        times, cpu = [], []
        machine0 = cpu_jiffies()
        for _ in range(a.reps):
            dist.barrier()
            t1, c1 = time.perf_counter(), time.process_time()
            dist.all_reduce(buf)
            times.append(time.perf_counter() - t1)
            cpu.append(time.process_time() - c1)  # this process's CPU, gloo's threads and its syscalls
        nbytes = numel * 4
        med = statistics.median(times)
        bus = 2 * (w - 1) / w * nbytes / med if w > 1 else None
        self.out["bandwidth"] = {
            "bytes": nbytes,
            "reps": a.reps,
            "seconds": [round(x, 6) for x in times],
            "median_s": round(med, 6),
            "algbw_gbit_s": round(nbytes * 8 / med / 1e9, 3),
            "busbw_gbit_s": round(bus * 8 / 1e9, 3) if bus else None,
            # how much of a core the transfer itself keeps busy: on a one-core node it competes with
            # the backward pass that DDP overlaps it with
            "cpu_s": [round(x, 6) for x in cpu],
            "cores_busy": round(statistics.median(cpu) / med, 3),
            # the whole machine's busy cores meanwhile (the kernel's network work in softirq is not in
            # the process's time): on simulated hosts that share a machine, all nodes and their link
            "machine_cores_busy": _machine_cores(machine0, cpu_jiffies()),
        }
        self.phase = "link"
        self.out["link"] = link_quality.measure(dist, torch, a.master_port)
        if link_quality.worth_weighing(self.out["link"]):  # a clean link costs nothing: no step to time
            self.phase = "compute_step"
            self.armed = time.monotonic()  # its own bound: a model on a busy node, not the link, takes time
            self.out["compute_step_s"] = compute_step_s(json.loads(a.model) if a.model else None)
        self.phase = "teardown"
        dist.barrier()
        dist.destroy_process_group()


def compute_step_s(sizes: dict | None, budget_s: float = STEP_BUDGET_S) -> float | None:
    """Seconds of one forward and backward pass of the run's model (the built-in trainer's, trainer/model.py
    beside nodeprobe on a node) at its batch and sequence length, on this rank's one thread: the least of a
    few after a warm-up, within about `budget_s`. A model whose batch exceeds STEP_FLOPS is timed on fewer
    sequences and scaled to the batch; one whose single sequence exceeds 4 x STEP_FLOPS is not timed. The
    step's compute, without the all-reduce; None without the model's sizes (your own code), the trainer, or
    for such a large model."""
    if not sizes:
        return None
    try:
        import torch

        from trainer.model import GPT, GPTConfig
        from trainer.sizes import flops_per_token
    except ImportError:
        return None
    c = GPTConfig(vocab_size=sizes["vocab"], seq_len=sizes["seq_len"], n_layer=sizes["depth"],
                  n_embd=sizes["n_embd"], n_head=sizes["n_head"])
    model = GPT(c)
    batch, per_sequence = sizes["batch_size"], flops_per_token(c) * c.seq_len
    if per_sequence > 4 * STEP_FLOPS:  # too long for the smoke test's bound on a slow node: not timed
        return None
    timed = max(1, min(batch, int(STEP_FLOPS // per_sequence)))
    x = torch.randint(0, c.vocab_size, (timed, c.seq_len))
    best, end = float("inf"), time.perf_counter() + budget_s
    for i in range(STEP_REPS + 1):
        t0 = time.perf_counter()
        model(x, x).backward()
        if i:  # the first pass allocates
            best = min(best, time.perf_counter() - t0)
        if time.perf_counter() > end:
            break
    seconds = best if best < float("inf") else time.perf_counter() - t0
    return round(seconds * batch / timed, 4)


def _machine_cores(before, after) -> float | None:
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1), 3)


def stop_listener(host: str, port: int, wait_s: float = 3.0) -> bool:
    """Ask the preflight's own listener on the master port to quit and wait until the port is free.

    Only a nodeprobe listener obeys (it answers with its banner first); anything else is left alone
    and the store phase then reports the port as taken. True when a listener was stopped.
    """
    from nodeprobe import net

    r = net.connect(host, port, 1.0, send_quit=True)
    if not r.get("nodeprobe_listener"):
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not net.connect(host, port, 0.5).get("nodeprobe_listener"):
            return True
        time.sleep(0.05)
    return True


def run(args) -> None:
    Smoke(args).run()


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def run_warm(args) -> None:
    """Hand the test to the warm child that ``gather`` left in ``args.warm`` and print its JSON line.

    Without a live warm child (it timed out, or gather ran elsewhere) the test runs here, cold.
    """
    import json
    import shutil
    from pathlib import Path

    folder = Path(args.warm)
    try:
        pid = json.loads((folder / "pid").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        pid = None
    if not _alive(pid):
        shutil.rmtree(folder, ignore_errors=True)
        return run(args)
    spec = {k: v for k, v in vars(args).items() if k not in ("warm", "cmd")}
    tmp = folder / "go.json.tmp"
    tmp.write_text(json.dumps(spec))
    os.replace(tmp, folder / "go.json")
    # the child's own watchdog ends it after timeout*3 (+ the import allowance): wait a little longer
    deadline = time.monotonic() + IMPORT_ALLOWANCE_S + args.timeout * 3 + 10
    part = folder / "result.part"
    while time.monotonic() < deadline:
        try:
            text = part.read_text()
        except OSError:
            text = ""
        if text.endswith("\n"):
            sys.stdout.write(text.splitlines()[-1] + "\n")
            sys.stdout.flush()
            shutil.rmtree(folder, ignore_errors=True)
            return None
        if not _alive(pid):
            break
        time.sleep(0.05)
    out = {"probe": "gloo-smoke", "host": socket.gethostname(), "rank": args.rank, "world": args.world,
           "ok": False, "phase": "warm", "hung": True, "checks": {},
           "error": f"the warm test process {pid} ended or hung without a result"}
    sys.stdout.write(json.dumps(out) + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    return None
