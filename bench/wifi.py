"""Wired-like vs Wi-Fi-like links between 2 hosts: what delay, jitter and loss do to the built-in trainer.

    sudo SIMLAN_LAB=2 .venv/bin/python bench/wifi.py [--rounds 3] [--steps 30]   # or: make bench-wifi

2 simulated hosts, each pinned to its own core (`--cpus auto`). Every link setting shapes both hosts'
outgoing packets (`simlan link`, simlan/wifi.py: NFQUEUE, as this kernel has no netem), so a round trip
gets each direction's delay:
  wired       a plain veth link (no delay, no loss)
  via-delayer every packet through the delayer, 10 us added: the cost of the emulation itself
  wifi        delay 2ms, jitter 3ms, loss 0.2 % per direction (a good home Wi-Fi: ~10 ms round trips)
  poor-wifi   delay 6ms, jitter 10ms, loss 1 % (a busy or distant access point: ~30 ms, spikes)
in interleaved rounds (every setting once per round). Per run: a TCP ping-pong between the hosts (100
round trips: p50, p90, jitter = p90 - p50) and a DDP run of the built-in trainer (its tokens/s and all-reduce
p50 after --timing-warmup-steps). Writes runs/bench-wifi-<id>/ (raw/, report.json, report.md, wifi.png)
and copies the report to bench/results/wifi/. Medians of the rounds, [min-max].
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.scaling_lab import machine_info, run_in_hosts  # noqa: E402

# via-delayer: every packet through the delayer with 10 us added: what the emulation itself costs
LINKS = {"wired": None, "via-delayer": ("10us", "0ms", "0%"), "wifi": ("2ms", "3ms", "0.2%"),
         "poor-wifi": ("6ms", "10ms", "1%")}
MODEL = ["--depth", "1", "--seq-len", "64", "--batch-size", "8", "--threads", "1", "--log-every", "10",
         "--check-every", "0", "--straggler-every", "0", "--pg-timeout-s", "120"]
MASTER_PORT, PING_PORT = 29651, 29652
RUN_TIMEOUT_S = 600
PING = """
import socket, sys, time, json
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if host == "serve":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", port))
    s.listen(); c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while (d := c.recv(64)): c.sendall(d)
else:
    for _ in range(100):
        try: c = socket.create_connection((host, port), timeout=5); break
        except OSError: time.sleep(0.1)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    rtts = []
    for _ in range(n):
        t = time.perf_counter(); c.sendall(b"x"); c.recv(64); rtts.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.01)
    print(json.dumps(rtts))
"""


def node_env() -> list[str]:
    return ["env", f"PYTHONPATH={REPO}", "OMP_NUM_THREADS=1", "MKL_NUM_THREADS=1", "PYTHONUNBUFFERED=1",
            "GLOO_SOCKET_IFNAME=eth0", "TORCH_CPP_LOG_LEVEL=ERROR"]


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


class Bench:
    def __init__(self, args):
        self.args = args
        venv = REPO / ".venv" / "bin" / "python"
        self.py = str(venv) if venv.exists() else sys.executable
        self.dir = REPO / "runs" / f"bench-wifi-{args.id}"
        self.hosts = ["node0", "node1"]

    def shape(self, link: str) -> None:
        delay, jitter, loss = LINKS[link] or ("0ms", "0ms", "0%")
        for h in self.hosts:
            self.cluster.set_link(h, delay, jitter, loss)

    def ping(self, rdir: Path) -> dict:
        server = self.cluster.popen("node1", [self.py, "-c", PING, "serve", str(PING_PORT), "0"])
        try:
            out = self.cluster.exec("node0", [self.py, "-c", PING, self.cluster.host("node1").addr,
                                              str(PING_PORT), "100"], timeout=120, check=True)
        finally:
            server.wait(timeout=30)
        rtts = sorted(json.loads(out.stdout))
        (rdir / "rtt_ms.json").write_text(json.dumps(rtts) + "\n")
        p50, p90 = statistics.median(rtts), rtts[int(0.9 * (len(rtts) - 1))]
        return {"rtt_ms_p50": round(p50, 2), "rtt_ms_p90": round(p90, 2), "jitter_ms": round(p90 - p50, 2)}

    def run(self, link: str, rnd: int) -> dict:
        rdir = self.dir / "raw" / f"round{rnd}" / link
        if rdir.exists():
            shutil.rmtree(rdir)
        rdir.mkdir(parents=True)
        self.shape(link)
        rtt = self.ping(rdir)
        master = self.cluster.host("node0").addr
        base = ["-m", "trainer", "--data", str(self.train_data), "--steps", str(self.args.steps), *MODEL,
                "--timing-warmup-steps", str(self.args.warmup), "--run-id", f"wifi-{link}-{rnd}"]

        def argv(i):
            return [*node_env(), self.py, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={i}",
                    "--nproc-per-node=1", f"--master-addr={master}", f"--master-port={MASTER_PORT}",
                    "--rdzv-conf=timeout=120", "--max-restarts=0", *base, "--out", str(rdir / self.hosts[i])]

        t0 = time.monotonic()
        run_in_hosts(self.cluster, argv, self.hosts, rdir, RUN_TIMEOUT_S)
        s = json.loads((rdir / "node0" / "summary.json").read_text())
        res = {"link": link, "round": rnd, **rtt, "tokens_per_sec": s["tokens_per_sec"],
               "step_ms_p50": s["step_ms_p50"], "allreduce_ms_p50": s["allreduce_ms_p50"],
               "wait_ms_p50": s.get("wait_ms_p50"), "wall_s": round(time.monotonic() - t0, 1)}
        (rdir / "result.json").write_text(json.dumps(res, indent=2) + "\n")
        print(f"[{time.strftime('%H:%M:%S')}] round {rnd} {link}: rtt p50 {rtt['rtt_ms_p50']} ms jitter "
              f"{rtt['jitter_ms']} ms; {res['tokens_per_sec']:.0f} tok/s, "
              f"step p50 {res['step_ms_p50']:.0f} ms, "
              f"all-reduce p50 {res['allreduce_ms_p50']:.1f} ms", flush=True)
        return res

    def main(self) -> int:
        from simlan import cluster as simlan
        from trainer.data.shards import prepare

        self.dir.mkdir(parents=True, exist_ok=True)
        self.train_data = self.dir / "data"
        if not (self.train_data / "manifest.json").exists():
            prepare(self.train_data, None, 1024, 32, 8, seed=0)
        self.load = [round(x, 2) for x in os.getloadavg()]
        self.cluster = simlan.up(2, cpus="auto", force=True)
        results = []
        try:
            for rnd in range(1, self.args.rounds + 1):
                for link in LINKS:
                    results.append(self.run(link, rnd))
                    (self.dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
        finally:
            simlan.down()
        report = summarize(results, self.args) | {"machine": machine_info() | {"load_before": self.load}}
        (self.dir / "report.json").write_text(json.dumps(report, indent=2) + "\n")
        (self.dir / "report.md").write_text(markdown(report))
        plot(self.dir / "wifi.png", report)
        dest = REPO / "bench" / "results" / "wifi"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("report.json", "report.md", "wifi.png"):
            shutil.copy2(self.dir / name, dest / name)
        print((self.dir / "report.md").read_text())
        return 0


KEYS = ("rtt_ms_p50", "jitter_ms", "tokens_per_sec", "step_ms_p50", "allreduce_ms_p50")


def summarize(results: list[dict], args) -> dict:
    links = {}
    for link in LINKS:
        mine = [r for r in results if r["link"] == link]
        links[link] = {"shaping": dict(zip(("delay", "jitter", "loss"), LINKS[link], strict=True))
                       if LINKS[link] else None, **{k: spread([r[k] for r in mine]) for k in KEYS}}
    wired = links["wired"]["tokens_per_sec"]["median"]
    for v in links.values():
        v["vs_wired"] = round(v["tokens_per_sec"]["median"] / wired, 3)
    return {"rounds": args.rounds, "steps": args.steps, "warmup": args.warmup, "model": MODEL, "links": links}


def markdown(rep: dict) -> str:
    def cell(s, fmt):
        return f"{s['median']:{fmt}} [{s['min']:{fmt}}-{s['max']:{fmt}}]"

    lines = ["# Wired-like vs Wi-Fi-like links, 2 simulated hosts (`bench/wifi.py`)", "",
             f"- {rep['rounds']} interleaved rounds, medians [min-max]; {rep['steps']} steps, the first "
             f"{rep['warmup']} untimed; model `{' '.join(rep['model'])}`",
             f"- machine: {rep['machine'].get('logical_cpus')} logical CPUs, load before "
             f"{rep['machine'].get('load_before')}", "",
             "| link | shaping per direction | round trip p50 ms | jitter (p90-p50) ms | tokens/s | vs wired "
             "| step ms p50 | all-reduce ms p50 |", "|---|---|---|---|---|---|---|---|"]
    for link, v in rep["links"].items():
        sh = v["shaping"]
        shaping = f"delay {sh['delay']}, jitter {sh['jitter']}, loss {sh['loss']}" if sh else "none"
        lines.append(f"| {link} | {shaping} | {cell(v['rtt_ms_p50'], '.2f')} | {cell(v['jitter_ms'], '.2f')} "
                     f"| {cell(v['tokens_per_sec'], '.0f')} | {v['vs_wired']:.2f}x | "
                     f"{cell(v['step_ms_p50'], '.0f')} | {cell(v['allreduce_ms_p50'], '.1f')} |")
    return "\n".join(lines + ["", "![wifi](wifi.png)", ""])


def plot(path: Path, rep: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rep["links"])
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, label in ((axes[0], "tokens_per_sec", "tokens/s"), (axes[1], "allreduce_ms_p50",
                                                                      "all-reduce ms p50")):
        med = [rep["links"][n][key]["median"] for n in names]
        lo = [m - rep["links"][n][key]["min"] for n, m in zip(names, med, strict=True)]
        hi = [rep["links"][n][key]["max"] - m for n, m in zip(names, med, strict=True)]
        colors = ["#4c72b0", "#8c8c8c", "#dd8452", "#c44e52"][:len(names)]
        ax.bar(names, med, yerr=[lo, hi], capsize=4, color=colors)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"2 simulated hosts, medians of {rep['rounds']} rounds [min-max]")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--id", default=time.strftime("%Y%m%d-%H%M%S"))
    return Bench(p.parse_args(argv)).main()


if __name__ == "__main__":
    sys.exit(main())
