"""The scaling lab's report: a pure function from the collected runs to the table, JSON and PNGs.

    .venv/bin/python bench/scaling_report.py runs/bench-<id>     # (re)build the report from what is there

Input (written by bench/scaling_lab.py), under the bench folder:
    meta.json                            rate, nodes, machine (cores, physical cores, load), via
    probe/gloo_smoke.rank{R}.json        `python -m nodeprobe gloo-smoke` output of each node
    raw/<size>/<label>/run.json          nodes, ranks_per_node, comm, where, cores_per_node, load
    raw/<size>/<label>/<node>/           the trainer's out dir of each node: config.json and
                                         summary.json (rank 0), metrics.rank{R}.jsonl
Output: report.md, report.json, scaling.png, loss.png.

Every number of a run comes from rank 0's metrics JSONL (as the trainer's own summary does), over the
timed steps: the steps after max(--timing-warmup-steps, the auto trial). A step's tokens count every rank.
- tokens/s = sum(tokens) / sum(dt); speedup = tokens/s / tokens/s of 1 node x 1 rank;
  scaling efficiency = speedup / ranks.
- step, compute, all-reduce, exposed ms: medians. exposed = the part of the step the all-reduce was not
  hidden under backward (trainer/metrics.py).
- all-reduce limit = 2(N-1)/N * bytes / link rate (ring all-reduce over N ranks); achieved bus bandwidth
  = 2(N-1)/N * bytes / all-reduce time; "% of link" = limit / measured time. Only for runs that cross the
  link (nodes > 1). The trainer's all-reduce time runs from the first bucket's launch to the last
  bucket's result, so it includes the gaps while backward produces the next bucket.
- alpha = sum(all-reduce ms) / sum(compute ms) of the N-node fp32 run; predicted speedup N / (1 + alpha(N-1)).
- A run that was attempted several times (bench/scaling_lab.py --repeat) is its fastest attempt; the
  tokens/s of every attempt are listed beside it.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def _read_json(path: Path, default=None):
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else default


# --- collection: files -> plain data -------------------------------------------------------------------
def collect(bench: Path) -> dict:
    """Everything the report needs, read from the bench folder (no computation)."""
    bench = Path(bench)
    data = {"meta": _read_json(bench / "meta.json", {}), "probe": [], "sizes": {}}
    for p in sorted((bench / "probe").glob("gloo_smoke.rank*.json")):
        data["probe"].append(_read_json(p))
    for size_dir in sorted(p for p in (bench / "raw").glob("*") if p.is_dir()):
        runs = []
        kept = [p for p in size_dir.iterdir() if (p / "run.json").exists() and ".try" not in p.name]
        for run_dir in sorted(kept):
            run = _read_json(run_dir / "run.json")
            node0 = run_dir / run.get("rank0_dir", "node0")
            run.update(label=run_dir.name, config=_read_json(node0 / "config.json", {}),
                       summary=_read_json(node0 / "summary.json", {}),
                       metrics=read_jsonl(node0 / "metrics.rank0.jsonl") if (node0 / "metrics.rank0.jsonl")
                       .exists() else [])
            runs.append(run)
        data["sizes"][size_dir.name] = runs
    return data


# --- computation: plain data -> report -------------------------------------------------------------------
def timed_records(run: dict) -> list[dict]:
    skip = max(run["config"].get("timing_warmup_steps", 0), run["summary"].get("comm_timing_skip_steps") or 0)
    recs = run["metrics"]
    return recs[skip:] if len(recs) > skip else recs[-1:]


def run_row(run: dict, base_tps: float | None, rate_bps: float | None) -> dict:
    recs = timed_records(run)
    nodes, per_node = run["nodes"], run["ranks_per_node"]
    ranks = nodes * per_node
    total_s = sum(r["dt_ms"] for r in recs) / 1e3
    tps = sum(r["tokens"] for r in recs) / total_s
    med = {k: statistics.median(r[k] for r in recs)
           for k in ("dt_ms", "compute_ms", "allreduce_ms", "exposed_ms")}
    nbytes = recs[-1]["allreduce_bytes"]
    comp, ar = sum(r["compute_ms"] for r in recs), sum(r["allreduce_ms"] for r in recs)
    row = {
        "label": run["label"], "nodes": nodes, "ranks_per_node": per_node, "ranks": ranks,
        "where": run.get("where"), "comm": run.get("comm", "fp32"),
        "comm_chosen": run["summary"].get("comm_chosen", run.get("comm", "fp32")),
        "timed_steps": len(recs), "tokens_per_sec": tps,
        "speedup": tps / base_tps if base_tps else None,
        "efficiency": tps / base_tps / ranks if base_tps else None,
        "step_ms": med["dt_ms"], "compute_ms": med["compute_ms"], "allreduce_ms": med["allreduce_ms"],
        "exposed_ms": med["exposed_ms"], "exposed_pct": 100 * med["exposed_ms"] / med["dt_ms"],
        "allreduce_bytes": nbytes, "alpha": ar / comp if comp > 0 and ranks > 1 else None,
        "busbw_gbit_s": None, "limit_ms": None, "link_pct": None,
        "loss_last": recs[-1]["loss"], "threads": run["config"].get("threads_resolved"),
        "cores_per_node": run.get("cores_per_node"), "load_before": run.get("load_before"),
        "attempts_tokens_per_sec": [a["tokens_per_sec"] for a in run.get("attempts", [])],
    }
    if ranks > 1 and med["allreduce_ms"] > 0:
        bus_bytes = 2 * (ranks - 1) / ranks * nbytes
        row["busbw_gbit_s"] = bus_bytes * 8 / (med["allreduce_ms"] / 1e3) / 1e9
        if nodes > 1 and rate_bps:
            row["limit_ms"] = bus_bytes * 8 / rate_bps * 1e3
            row["link_pct"] = 100 * row["limit_ms"] / med["allreduce_ms"]
    return row


def thread_notes(run: dict, machine: dict) -> list[str]:
    notes = []
    threads = run["config"].get("threads_resolved")
    cores = run.get("cores_per_node")
    if threads and cores and threads * run["ranks_per_node"] > cores:
        notes.append(f"{run['label']}: {run['ranks_per_node']} rank(s) x {threads} threads = "
                     f"{threads * run['ranks_per_node']} threads on a node with {cores} core(s): "
                     f"oversubscribed")
    phys, logical = machine.get("physical_cores"), machine.get("logical_cpus")
    if run["nodes"] > 1 and phys and run["nodes"] * (cores or 1) > phys:
        notes.append(f"{run['label']}: {run['nodes']} simulated nodes x {cores} core(s) on a machine with "
                     f"{phys} physical cores: the nodes share cores")
    if phys and logical and logical > phys and threads and threads * run["ranks_per_node"] > phys:
        notes.append(f"{run['label']}: threads exceed the {phys} physical cores (hyperthreads)")
    return notes


def probe_summary(probe: list[dict], rate_bps: float | None) -> dict | None:
    rows = [p for p in probe if p and p.get("bandwidth")]
    if not rows:
        return {"ok": False, "error": "; ".join(str(p.get("error")) for p in probe if p)} if probe else None
    bw = rows[0]["bandwidth"]
    world = rows[0]["world"]
    out = {"ok": all(p.get("ok") for p in probe), "world": world, "bytes": bw["bytes"],
           "median_s": bw["median_s"], "busbw_gbit_s": bw["busbw_gbit_s"], "algbw_gbit_s": bw["algbw_gbit_s"]}
    if rate_bps and world > 1:
        out["limit_s"] = 2 * (world - 1) / world * bw["bytes"] * 8 / rate_bps
        out["link_pct"] = 100 * out["limit_s"] / bw["median_s"]
    return out


def build(data: dict) -> dict:
    meta = data["meta"]
    rate_bps = meta.get("rate_bps")
    machine = meta.get("machine", {})
    report = {"id": meta.get("id"), "rate": meta.get("rate"), "rate_bps": rate_bps,
              "nodes": meta.get("nodes"), "via": meta.get("via"), "machine": machine,
              "probe": probe_summary(data["probe"], rate_bps),
              "sizes": {}, "notes": []}
    for size, runs in data["sizes"].items():
        runs = [r for r in runs if r["metrics"]]
        base = next((r for r in runs if r["nodes"] == 1 and r["ranks_per_node"] == 1), None)
        base_tps = run_row(base, None, rate_bps)["tokens_per_sec"] if base else None
        rows = [run_row(r, base_tps, rate_bps) for r in runs]
        multi = [r for r in rows if r["nodes"] > 1 and r["comm"] == "fp32"]
        alpha = multi[0]["alpha"] if multi else None
        params = next((r["summary"].get("params") for r in runs if r["summary"].get("params")), None)
        auto = next((r for r in rows if r["nodes"] > 1 and r["comm"] == "auto"), None)
        entry = {"params": params, "rows": rows, "alpha": alpha,
                 "model": {k: runs[0]["config"].get(k) for k in ("depth", "n_embd", "n_head", "seq_len",
                                                                   "batch_size")} if runs else {},
                 "auto_vs_fp32": (auto["tokens_per_sec"] / multi[0]["tokens_per_sec"]
                                  if auto and multi else None),
                 "auto_choice": auto["comm_chosen"] if auto else None,
                 "loss_curves": {f"{r['label']}": [(m["step"], m["loss"]) for m in r["metrics"]]
                                 for r in runs if r["nodes"] > 1}}
        trial = next((r["summary"].get("comm_auto") for r in runs
                      if r["nodes"] > 1 and r.get("comm") == "auto" and r["summary"].get("comm_auto")), None)
        if trial:  # auto's own side-by-side steps: one run, adjacent steps, so less exposed to load drift
            entry["auto_trial"] = {"choice": trial["choice"], "speedup_vs_fp32": trial["speedup_vs_fp32"],
                                   "options": {c: {k: o.get(k) for k in ("tokens_per_sec", "step_ms",
                                                                         "alpha")}
                                               for c, o in trial["options"].items()}}
        loads = [r["load_before"][0] for r in rows if r.get("load_before")]
        cpus = machine.get("logical_cpus")
        # the bench's own ranks keep the load near the CPU count; beyond that (or a wide spread) others ran
        if loads and cpus and (max(loads) > cpus * 1.25 or max(loads) - min(loads) > 1.5):
            report["notes"].append(
                f"{size}: the machine was busy with other work (1-min load {min(loads):.1f} to "
                f"{max(loads):.1f} on {cpus} CPUs before the runs): runs that ran under different load are "
                f"compared, so speedups and efficiencies above 1 per rank are load artifacts, not scaling")
        solo = next((r for r in rows if r["nodes"] == 1 and r["ranks_per_node"] == 1), None)
        if multi and solo:
            # the most any --comm option can gain over fp32: a step cannot be shorter than one rank's solo
            # step (communication that cost nothing, on a core that computes as fast as alone)
            entry["comm_headroom"] = multi[0]["step_ms"] / solo["step_ms"]
        if alpha is not None:
            entry["predicted_speedup"] = {n: n / (1 + alpha * (n - 1)) for n in range(1, max(4, meta.get(
                "nodes", 2)) + 1)}
        report["sizes"][size] = entry
        for r in runs:
            report["notes"] += thread_notes(r, machine)
    return report


# --- output ------------------------------------------------------------------------------------------------
def _f(x, fmt=".1f", none="-"):
    return none if x is None else format(x, fmt)


def markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [f"# Scaling lab {rep['id']}", "",
             f"Link: {rep['rate'] or 'unshaped'} between {rep['nodes']} simulated nodes (one core each), "
             f"launched via {rep['via']}. Machine: {m.get('logical_cpus')} CPUs ({m.get('physical_cores')} "
             f"physical cores). Other work on the machine shares the cores: the load average (1, 5, 15 "
             f"min) before each kept run is in the table; the bench started at {m.get('load_before')} and "
             f"ended at {m.get('load_after')}.", ""]
    p = rep["probe"]
    if p and p.get("busbw_gbit_s"):
        lines += [f"Link probe (`nodeprobe gloo-smoke`, {p['world']} ranks, {p['bytes'] / 2**20:.0f} MiB "
                  f"fp32 all-reduce): {p['median_s'] * 1e3:.0f} ms = bus bandwidth "
                  f"{p['busbw_gbit_s']:.3f} Gbit/s; "
                  f"limit 2(N-1)/N*bytes/rate = {_f(p.get('limit_s', 0) * 1e3, '.0f')} ms, so "
                  f"**{_f(p.get('link_pct'))} % of the link limit**.", ""]
    elif p:
        lines += [f"Link probe failed: {p.get('error')}", ""]
    head = ("| run | comm | tok/s | speedup | efficiency | step ms | compute ms | all-reduce ms | exposed ms "
            "(% of step) | MB/step | bus Gbit/s | limit ms | % of link | alpha | loss | tok/s per attempt "
            "| load |")
    for size, e in rep["sizes"].items():
        md = e["model"]
        title = (f"## {size}: {e['params']:,} parameters (depth {md.get('depth')}, width "
                 f"{md.get('n_embd')}, seq {md.get('seq_len')}, batch {md.get('batch_size')} per rank)"
                 if e["params"] else f"## {size}")
        lines += [title, "", head, "|" + "---|" * 17]
        for r in e["rows"]:
            comm = r["comm"] + (f" -> {r['comm_chosen']}" if r["comm"] == "auto" else "")
            lines.append(
                f"| {r['label']} | {comm} | {r['tokens_per_sec']:.1f} | {_f(r['speedup'], '.2f')} | "
                f"{_f(r['efficiency'], '.2f')} | {r['step_ms']:.0f} | {r['compute_ms']:.0f} | "
                f"{r['allreduce_ms']:.0f} | {r['exposed_ms']:.0f} ({r['exposed_pct']:.0f} %) | "
                f"{r['allreduce_bytes'] / 1e6:.1f} | {_f(r['busbw_gbit_s'], '.3f')} | "
                f"{_f(r['limit_ms'], '.0f')} | "
                f"{_f(r['link_pct'])} | {_f(r['alpha'], '.3f')} | {r['loss_last']:.3f} | "
                f"{', '.join(f'{t:.0f}' for t in r['attempts_tokens_per_sec'])} | "
                f"{'/'.join(f'{x:.1f}' for x in r['load_before'] or [])} |")
        lines.append("")
        if e["alpha"] is not None:
            pred = ", ".join(f"{n}: {s:.2f}" for n, s in e["predicted_speedup"].items())
            lines += [f"alpha (fp32, {rep['nodes']} nodes) = {e['alpha']:.3f}; predicted speedup "
                      f"N/(1+alpha(N-1)): {pred}.", ""]
        if e.get("auto_trial"):
            t = e["auto_trial"]
            opts = ", ".join(f"{c} {o['tokens_per_sec']:.1f} tok/s (alpha {o['alpha']})"
                             for c, o in t["options"].items())
            lines += [f"`--comm auto` trial (adjacent steps of one run): {opts} -> {t['choice']}, "
                      f"{t['speedup_vs_fp32']:.2f}x fp32.", ""]
        if e["auto_vs_fp32"] is not None:
            lines += [f"`--comm auto` chose {e['auto_choice']}: {e['auto_vs_fp32']:.2f}x the tokens/s of "
                      f"fp32 on {rep['nodes']} nodes (steady state, trial steps left out).", ""]
        if e.get("comm_headroom") is not None:
            lines += [f"Headroom: the {rep['nodes']}x1 fp32 step is {e['comm_headroom']:.2f}x the 1x1 step, "
                      f"so no way of sending gradients can make a step more than {e['comm_headroom']:.2f}x "
                      f"faster than fp32 here (communication that cost nothing).", ""]
    if rep["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""]
    lines += ["Definitions: bench/scaling_report.py. Raw data: raw/<size>/<run>/<node>/ (trainer out "
              "dirs).", ""]
    return "\n".join(lines)


def plots(rep: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    nmax = max([4] + [max(e.get("predicted_speedup", {1: 1})) for e in rep["sizes"].values()])
    ax.plot([1, nmax], [1, nmax], "k--", lw=1, label="ideal")
    for i, (size, e) in enumerate(rep["sizes"].items()):
        col = f"C{i}"
        pts = sorted((r["nodes"], r["speedup"]) for r in e["rows"]
                     if r["ranks_per_node"] == 1 and r["comm"] == "fp32" and r["speedup"])
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", color=col, label=f"{size}: measured (fp32)")
        for r in e["rows"]:
            if r["nodes"] > 1 and r["comm"] == "auto" and r["speedup"]:
                ax.plot(r["nodes"], r["speedup"], "*", ms=12, color=col,
                        label=f"{size}: auto ({r['comm_chosen']})")
            if r["nodes"] == 1 and r["ranks_per_node"] > 1 and r["speedup"]:
                ax.plot(r["ranks"], r["speedup"], "s", mfc="none", color=col,
                        label=f"{size}: 1 node x 2 ranks")
        if e.get("predicted_speedup"):
            ns = sorted(e["predicted_speedup"])
            ax.plot(ns, [e["predicted_speedup"][n] for n in ns], ":", color=col,
                    label=f"{size}: N/(1+alpha(N-1)), alpha={e['alpha']:.2f}")
    ax.set_xlabel("nodes (1 rank each)")
    ax.set_ylabel("speedup in tokens/s vs 1 node")
    ax.set_title(f"ddplab scaling at {rep['rate'] or 'unshaped'}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)

    sizes = [(s, e) for s, e in rep["sizes"].items() if e["loss_curves"]]
    if sizes:
        fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.2), squeeze=False)
        for ax, (size, e) in zip(axes[0], sizes, strict=True):
            for label, pts in e["loss_curves"].items():
                ax.plot(*zip(*pts, strict=True), label=label, lw=1.2)
            ax.set_title(f"{size}: loss of rank 0 per comm option")
            ax.set_xlabel("step")
            ax.set_ylabel("loss")
            ax.legend(fontsize=7)
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "loss.png", dpi=110)
        plt.close(fig)


def write(rep: dict, out: Path) -> None:
    out = Path(out)
    (out / "report.json").write_text(json.dumps(rep, indent=2, sort_keys=True) + "\n")
    (out / "report.md").write_text(markdown(rep))
    plots(rep, out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "raw").is_dir():
        print("ddplab: error: give one bench folder holding raw/ (made by bench/scaling_lab.py), e.g. "
              "runs/bench-<id>", file=sys.stderr)
        return 2
    rep = build(collect(Path(argv[0])))
    write(rep, Path(argv[0]))
    print(markdown(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
