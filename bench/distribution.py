"""Star vs relay: the time to give every node the same data, and the bytes that leave the control host.

    .venv/bin/python bench/distribution.py [--nodes 2 4 8] [--size-mb 1024] [--rounds 3]
                                           [--uplink 100mbit] [--lan 1gbit] [--scenarios shaped flat]
                                           [--out bench/results/distribution]

One simlan cluster of max(--nodes) root hosts, every host's link at --lan (simlan --rate). Two scenarios:
``shaped``: the control host's uplink (tc tbf on the bridge ``lab<k>``: what the root namespace sends into
the LAN) at --uplink, slower than the LAN, as a laptop on Wi-Fi beside a wired lab; ``flat``: the uplink at
--lan too. The data is --size-mb of random bytes in PARTS files. Node-to-node SSH is set up by the real
role (``playbooks/prepare.yml --tags data -e ddplab_distribution=relay``: roles/relay_ssh, each node's own
key limited to its peers' staging folders; each relayed batch is placed after its sha256 check). Each timed
run sends the data to the first N nodes:

- star: ``sync_push.push`` to each node at once (as the playbook does with its forks);
- relay: ``relay.relay`` (control -> node0 once, then the nodes pass it on).

Rounds are interleaved (every scenario, node count and mode once per round, the mode order alternating);
the node copies are removed before each run and every node's sha256 is proven after it. The bytes that
left the control host are the bridge's tx counter over the run. The limit is size / uplink: one copy
through the control host's link. Last, the resume check: a relay to all nodes (shaped) is killed halfway,
run again, and every node's sha256 proven; the second run's control bytes are recorded.

Writes bench/results/distribution/report.json, report.md and distribution.png. Needs root (simlan).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "results" / "distribution"
PARTS = 8
NODE_ROOT = "/root/ddplab"  # ddplab_root (~/ddplab) of a root simlan host
DEST = "bench-data"  # under the lab folder, removed before each run and at the end


def lab() -> int:
    return int(os.environ.get("SIMLAN_LAB", "0") or 0)


def bridge() -> str:
    return f"lab{lab()}"


def inventory() -> Path:
    return REPO / "inventory" / ("simlan" if lab() == 0 else f"simlan{lab()}")


def rate_bps(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for unit, mult in units.items():
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * mult
    raise SystemExit(f"bench: error: rate {rate!r}: use e.g. 100mbit or 1gbit")


def sh(argv: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=True, text=True, capture_output=True, **kw)


def shape_uplink(rate: str) -> None:
    sh(["tc", "qdisc", "replace", "dev", bridge(), "root", "tbf", "rate", rate, "burst", "256kb",
        "latency", "50ms"])


def unshape_uplink() -> None:
    subprocess.run(["tc", "qdisc", "del", "dev", bridge(), "root"], capture_output=True)


def tx_bytes() -> int:
    return int(Path(f"/sys/class/net/{bridge()}/statistics/tx_bytes").read_text())


def conn(i: int) -> dict:
    inv = inventory()
    return {"local": False, "host": f"10.77.{lab()}.{10 + i}", "user": "root", "port": None,
            "key": str(inv / ".ssh" / "id_ed25519"), "ssh_args": "",
            "common_args": "-o UserKnownHostsFile=/dev/null -o StrictHostKeyChecking=no -o LogLevel=ERROR",
            "extra_args": ""}


def on_node(i: int, command: str) -> str:
    from ddplab import relay
    node = {"conn": conn(i)}
    return sh(relay.node_ssh(node) + ["--", command], timeout=600).stdout


def make_data(folder: Path, size_mb: int) -> dict[str, str]:
    """PARTS files of random bytes; {name: sha256}."""
    sums = {}
    per = size_mb // PARTS
    for p in range(PARTS):
        name = f"part{p}.bin"
        h = hashlib.sha256()
        with open(folder / name, "wb") as f:
            for _ in range(per):
                block = os.urandom(1 << 20)
                h.update(block)
                f.write(block)
        sums[name] = h.hexdigest()
    return sums


def node_spec(i: int, folder: Path) -> dict:
    return {"name": f"node{i}", "root": NODE_ROOT, "addr": f"10.77.{lab()}.{10 + i}", "conn": conn(i),
            "base": f"{NODE_ROOT}/{DEST}", "src_dir": str(folder),
            "files": [f"part{p}.bin" for p in range(PARTS)]}


def clean(n: int) -> None:
    threads = [threading.Thread(target=on_node, args=(i, f"rm -rf {NODE_ROOT}/{DEST} && mkdir -p "
                                                         f"{NODE_ROOT}/{DEST}")) for i in range(n)]
    [t.start() for t in threads]
    [t.join() for t in threads]


def prove(n: int, sums: dict[str, str]) -> None:
    """Every node's copy against the control host's sha256 (raises naming the node)."""
    bad = []

    def check(i):
        out = on_node(i, f"cd {NODE_ROOT}/{DEST} && sha256sum " + " ".join(sorted(sums)))
        got = dict(reversed(line.split()) for line in out.splitlines())
        if got != sums:
            bad.append(f"node{i}")
    threads = [threading.Thread(target=check, args=(i,)) for i in range(n)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if bad:
        raise SystemExit(f"bench: error: sha256 differs on {', '.join(sorted(bad))}")


def star(n: int, folder: Path) -> None:
    from ddplab import sync_push
    errors = []

    def push(i):
        try:
            sync_push.push({**node_spec(i, folder)}, lambda state: None)
        except Exception as e:  # noqa: BLE001 - reported after the join
            errors.append(f"node{i}: {e}")
    threads = [threading.Thread(target=push, args=(i,)) for i in range(n)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    if errors:
        raise SystemExit(f"bench: error: star: {'; '.join(errors)}")


def relay_run(n: int, folder: Path, progress: str) -> dict:
    from ddplab import relay
    return relay.relay({"nodes": [node_spec(i, folder) for i in range(n)]}, progress)


def timed(mode: str, n: int, folder: Path, sums: dict, progress: str) -> dict:
    clean(n)
    before, start = tx_bytes(), time.monotonic()
    star(n, folder) if mode == "star" else relay_run(n, folder, progress)
    elapsed = time.monotonic() - start
    sent = tx_bytes() - before
    prove(n, sums)
    return {"s": round(elapsed, 2), "control_bytes": sent}


def resume_check(n: int, folder: Path, sums: dict, size: int, progress: str) -> dict:
    """A relay to n nodes killed once half the data left the control host, then run again."""
    clean(n)
    spec = json.dumps({"nodes": [node_spec(i, folder) for i in range(n)]})
    before = tx_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "ddplab", "relay", "--progress", progress], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    proc.stdin.write(spec)
    proc.stdin.close()
    while tx_bytes() - before < size // 2 and proc.poll() is None:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first = tx_bytes() - before
    time.sleep(2)  # let the holders' rsyncs notice their lost peers
    before, start = tx_bytes(), time.monotonic()
    out = subprocess.run([sys.executable, "-m", "ddplab", "relay", "--progress", progress], cwd=REPO,
                         input=spec, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench: error: the resumed relay failed: {out.stderr.strip()}")
    elapsed, second = time.monotonic() - start, tx_bytes() - before
    prove(n, sums)
    return {"nodes": n, "killed_after_control_bytes": first, "resumed_s": round(elapsed, 2),
            "resumed_control_bytes": second, "sha256_proven_on": n, "result": json.loads(out.stdout)}


def setup_relay(n: int, runs: Path) -> None:
    """roles/relay_ssh through prepare.yml (tags data: also the default shards, data/shards): the real
    node-to-node SSH."""
    extra = json.dumps({"ddplab_distribution": "relay", "ddplab_runs_dir": str(runs)})
    proc = subprocess.run([str(REPO / ".venv/bin/ansible-playbook"), "-i", str(inventory()),
                           "playbooks/prepare.yml", "--tags", "data", "-e", extra], cwd=REPO,
                          capture_output=True, text=True)
    if proc.returncode != 0 or "relay: each changed file" not in proc.stdout:
        raise SystemExit(f"bench: error: relay setup failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")


def summary(runs: list[dict], limit_s: float) -> dict:
    times = [r["s"] for r in runs]
    sent = [r["control_bytes"] for r in runs]
    med = statistics.median(times)
    return {"median_s": round(med, 2), "min_s": min(times), "max_s": max(times), "rounds": len(times),
            "control_bytes_median": int(statistics.median(sent)), "limit_s": round(limit_s, 2),
            "x_limit": round(med / limit_s, 2), "runs": runs}


def write_report(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    size = report["size_bytes"]
    lines = [f"# Star vs relay: {size / 2**20:.0f} MiB to N simulated nodes", "",
             f"{report['rounds']} interleaved rounds; LAN {report['lan']} per host; median (min-max) s; "
             "control bytes = what left the control host (bridge tx, median); limit = size / uplink "
             "(one copy through the control host's link).", "",
             "| uplink | nodes | mode | median s | min-max s | x limit | control bytes | x size |",
             "|---|---|---|---|---|---|---|---|"]
    for scen, by_n in report["scenarios"].items():
        for n, modes in by_n.items():
            for mode, s in modes.items():
                lines.append(f"| {scen} ({report['uplinks'][scen]}) | {n} | {mode} | {s['median_s']} | "
                             f"{s['min_s']}-{s['max_s']} | {s['x_limit']} | {s['control_bytes_median']:,} | "
                             f"{s['control_bytes_median'] / size:.2f} |")
    if report.get("resume"):
        r = report["resume"]
        lines += ["", f"Resume: a relay to {r['nodes']} nodes (shaped) killed after "
                  f"{r['killed_after_control_bytes']:,} control bytes, run again: {r['resumed_s']} s, "
                  f"{r['resumed_control_bytes']:,} more control bytes, sha256 proven on "
                  f"{r['sha256_proven_on']} nodes."]
    lines += ["", f"Machine: {report['machine']}"]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    plot(report, out)


def plot(report: dict, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cols = len(report["scenarios"])
    fig, axes = plt.subplots(1, cols, figsize=(5 * cols, 4), squeeze=False)
    for ax, (scen, by_n) in zip(axes[0], report["scenarios"].items(), strict=True):
        ns = [int(n) for n in by_n]
        for mode, color in (("star", "tab:red"), ("relay", "tab:blue")):
            med = [by_n[str(n)][mode]["median_s"] for n in ns]
            lo = [m - by_n[str(n)][mode]["min_s"] for m, n in zip(med, ns, strict=True)]
            hi = [by_n[str(n)][mode]["max_s"] - m for m, n in zip(med, ns, strict=True)]
            ax.errorbar(ns, med, yerr=[lo, hi], marker="o", color=color, label=mode, capsize=3)
        limit = by_n[str(ns[0])]["star"]["limit_s"]
        ax.axhline(limit, color="gray", ls="--", label="size / uplink")
        ax.axhline(1.5 * limit, color="gray", ls=":", label="1.5x limit")
        ax.set(title=f"{scen}: uplink {report['uplinks'][scen]}, LAN {report['lan']}", xlabel="nodes",
               ylabel="seconds (median, min-max)", xticks=ns)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out / "distribution.png", dpi=100)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--uplink", default="100mbit")
    ap.add_argument("--lan", default="1gbit")
    ap.add_argument("--scenarios", nargs="+", choices=("shaped", "flat"), default=["shaped", "flat"],
                    help="shaped: the control host's uplink at --uplink; flat: at --lan")
    ap.add_argument("--out", type=Path, default=OUT, help="where report.json, report.md and the plot go")
    ap.add_argument("--no-resume", action="store_true", help="skip the interrupted-relay check")
    a = ap.parse_args(argv)
    uplinks = {s: {"shaped": a.uplink, "flat": a.lan}[s] for s in a.scenarios}
    top = max(a.nodes)
    sh([sys.executable, "-m", "simlan", "up", "--nodes", str(top), "--rate", a.lan, "--force"], cwd=REPO)
    results: dict = {s: {str(n): {"star": [], "relay": []} for n in a.nodes} for s in uplinks}
    resume = None
    with tempfile.TemporaryDirectory(prefix="bench-distribution-") as tmp:
        folder, runs = Path(tmp) / "data", Path(tmp) / "runs"
        folder.mkdir()
        sums = make_data(folder, a.size_mb)
        size = sum((folder / f).stat().st_size for f in sums)
        setup_relay(top, runs)
        progress = str(Path(tmp) / "relay.json")
        try:
            for r in range(a.rounds):
                for scen, rate in uplinks.items():
                    shape_uplink(rate)
                    for n in a.nodes:
                        for mode in (("star", "relay") if r % 2 == 0 else ("relay", "star")):
                            run = timed(mode, n, folder, sums, progress)
                            results[scen][str(n)][mode].append(run)
                            print(f"round {r + 1} {scen} {n} nodes {mode}: {run['s']} s, "
                                  f"{run['control_bytes'] / size:.2f}x size from the control host",
                                  flush=True)
            if not a.no_resume:
                shape_uplink(a.uplink)
                resume = resume_check(top, folder, sums, size, progress)
                print(f"resume: {resume}", flush=True)
        finally:
            unshape_uplink()
            clean(top)
            [on_node(i, f"rm -rf {NODE_ROOT}/{DEST}") for i in range(top)]
    report = {"size_bytes": size, "rounds": a.rounds, "lan": a.lan, "uplinks": uplinks,
              "scenarios": {scen: {n: {mode: summary(runs_, size * 8 / rate_bps(uplinks[scen]))
                                       for mode, runs_ in modes.items()} for n, modes in by_n.items()}
                            for scen, by_n in results.items()},
              "resume": resume,
              "machine": f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at the end; simlan root "
                         f"hosts (lab {lab()}), rsync over ssh on one machine"}
    write_report(report, a.out)
    print((a.out / "report.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
