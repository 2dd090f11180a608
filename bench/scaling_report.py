"""The scaling lab's report: a pure function from the collected runs to the table, JSON and PNGs.

    .venv/bin/python bench/scaling_report.py runs/bench-<id>     # (re)build the report from what is there

Input (written by bench/scaling_lab.py), under the bench folder:
    meta.json                            rate, nodes, machine (cores, physical cores, load), via
    probe/gloo_smoke.rank{R}.json        `python -m nodeprobe gloo-smoke` output of each node
    raw/<size>/<label>/round<K>/run.json nodes, ranks_per_node, comm, where, cores_per_node, load
    raw/<size>/<label>/round<K>/<node>/  the trainer's out dir of each node: config.json and
                                         summary.json (rank 0), metrics.rank{R}.jsonl
    (a label folder holding run.json itself, the older layout, is one round)
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
- Rounds (bench/scaling_lab.py --repeat): every configuration runs once per round, interleaved. Each
  figure of a row is the median over the rounds, with min and max beside tokens/s, speedup and
  efficiency; a ratio (speedup, efficiency, auto vs fp32, headroom) is taken within each round (against
  that round's 1-node run) and then summarized, so a slow spell of the machine that hits one round
  does not make a ratio of two different rounds. A round without its 1x1 run gives no ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scaling_plots beside it, however imported
from scaling_plots import plots  # noqa: E402

from ddplab import lowcomm_advice  # noqa: E402


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in Path(path).read_text().splitlines() if ln.strip()]


def _read_json(path: Path, default=None):
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else default


# --- collection: files -> plain data -------------------------------------------------------------------
def collect(bench: Path) -> dict:
    """Everything the report needs, read from the bench folder (no computation). Each run carries its
    label and round."""
    bench = Path(bench)
    data = {"meta": _read_json(bench / "meta.json", {}), "probe": [], "sizes": {}}
    for p in sorted((bench / "probe").glob("gloo_smoke.rank*.json")):
        data["probe"].append(_read_json(p))
    for size_dir in sorted(p for p in (bench / "raw").glob("*") if p.is_dir()):
        runs = []
        for label_dir in sorted(p for p in size_dir.iterdir() if p.is_dir() and ".try" not in p.name):
            rounds = [(0, label_dir)] if (label_dir / "run.json").exists() else sorted(
                (int(p.name[5:]), p) for p in label_dir.glob("round*")
                if p.name[5:].isdigit() and (p / "run.json").exists())
            for k, run_dir in rounds:
                run = _read_json(run_dir / "run.json")
                node0 = run_dir / run.get("rank0_dir", "node0")
                metrics = node0 / "metrics.rank0.jsonl"
                run.update(label=label_dir.name, round=k, config=_read_json(node0 / "config.json", {}),
                           summary=_read_json(node0 / "summary.json", {}),
                           metrics=read_jsonl(metrics) if metrics.exists() else [])
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
    keys = ("dt_ms", "compute_ms", "allreduce_ms", "exposed_ms")
    med = {k: statistics.median(r[k] for r in recs) for k in keys}
    nbytes = recs[-1]["allreduce_bytes"]
    syncs = [r for r in recs if "sync_ms" in r and r["allreduce_bytes"]]
    if syncs:  # local SGD: most steps send nothing, so the median step would hide the syncs' cost
        med = {k: statistics.fmean(r[k] for r in recs) for k in keys}  # per step, syncs included
        nbytes = statistics.fmean(r["allreduce_bytes"] for r in recs)
        per_sync = {"ms": statistics.median(r["allreduce_ms"] for r in syncs),
                    "bytes": syncs[-1]["allreduce_bytes"],
                    # the wait for the slower rank before the transfer (trainers that measure it apart)
                    "wait": statistics.median(r["sync_wait_ms"] for r in syncs)
                    if all("sync_wait_ms" in r for r in syncs) else None,
                    # --sync-overlap: a sync's all-reduce runs under the next steps; only the blocked
                    # time shows, which says nothing of the link's speed
                    "overlapped": any(r.get("overlapped") for r in syncs)}
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
        # train loss of the last step: the mean over all ranks where the trainer logged it, else rank 0's
        "loss_last": recs[-1].get("loss_mean", recs[-1]["loss"]), "val_loss": run["summary"].get("val_loss"),
        "steps": len(run["metrics"]), "threads": run["config"].get("threads_resolved"),
        "cores_per_node": run.get("cores_per_node"), "load_before": run.get("load_before"),
    }
    # the link: one all-reduce (a step's, or a local-SGD sync's) against the wire's limit
    one = per_sync if syncs else {"ms": med["allreduce_ms"], "bytes": nbytes}
    if syncs:
        row["sync_ms"], row["sync_bytes"], row["sync_wait_ms"] = one["ms"], one["bytes"], one["wait"]
        row["sync_overlapped"] = one["overlapped"]
    if ranks > 1 and one["ms"] > 0 and not one.get("overlapped"):
        bus_bytes = 2 * (ranks - 1) / ranks * one["bytes"]
        row["busbw_gbit_s"] = bus_bytes * 8 / (one["ms"] / 1e3) / 1e9
        if nodes > 1 and rate_bps:
            row["limit_ms"] = bus_bytes * 8 / rate_bps * 1e3
            row["link_pct"] = 100 * row["limit_ms"] / one["ms"]
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
           "median_s": bw["median_s"], "busbw_gbit_s": bw["busbw_gbit_s"], "algbw_gbit_s": bw["algbw_gbit_s"],
           # each node's CPU spent on the transfer, in cores (probes before this field have none)
           "cores_busy": [p["bandwidth"].get("cores_busy") for p in rows],
           "machine_cores_busy": bw.get("machine_cores_busy")}
    if rate_bps and world > 1:
        out["limit_s"] = 2 * (world - 1) / world * bw["bytes"] * 8 / rate_bps
        out["link_pct"] = 100 * out["limit_s"] / bw["median_s"]
    return out


# the fields of a row summarized as median [min, max] over the rounds (the rest: median only)
SPREAD = ("tokens_per_sec", "speedup", "efficiency")


def spread(values: list) -> dict | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def summarize(round_rows: list[dict]) -> dict:
    """One row from the same configuration's rows of several rounds: numbers become their median over the
    rounds (SPREAD fields also get `<field>_min`/`_max`), texts and settings come from the first round."""
    row = dict(round_rows[0])
    row["rounds"] = len(round_rows)
    for key, first in round_rows[0].items():
        if isinstance(first, (int, float)) and not isinstance(first, bool) or first is None:
            s = spread([r.get(key) for r in round_rows])
            row[key] = None if s is None else s["median"]
            if key in SPREAD:
                row[f"{key}_min"], row[f"{key}_max"] = (None, None) if s is None else (s["min"], s["max"])
    row["load_before"] = [r.get("load_before") for r in round_rows]
    return row


def advice(row: dict, params: int | None, study: dict | None) -> dict | None:
    """The run report's low-communication advice (ddplab/lowcomm_advice.py) for a per-step fp32 row: its
    medians over the rounds stand for the run's timing."""
    if not params:
        return None
    run = {"world_size": row["ranks"], "local_sgd": None, "comm_chosen": row["comm_chosen"], "params": params,
           "step_ms_p50": row["step_ms"], "exposed_ms_p50": row["exposed_ms"], "steps": row["steps"]}
    return lowcomm_advice.advice(run, study)


def build(data: dict, study: dict | None = None) -> dict:
    """study: the long low-communication study the advice quotes (default: the committed one)."""
    study = lowcomm_advice.load_study() if study is None else study
    meta = data["meta"]
    rate_bps = meta.get("rate_bps")
    machine = meta.get("machine", {})
    report = {"id": meta.get("id"), "rate": meta.get("rate"), "rate_bps": rate_bps,
              "nodes": meta.get("nodes"), "via": meta.get("via"), "machine": machine,
              "node_cpu": meta.get("node_cpu"),
              "probe": probe_summary(data["probe"], rate_bps),
              "sizes": {}, "notes": []}
    for size, runs in data["sizes"].items():
        runs = [r for r in runs if r["metrics"]]
        per_round: dict[int, dict[str, dict]] = {}
        for k in sorted({r["round"] for r in runs}):
            here = [r for r in runs if r["round"] == k]
            base = next((r for r in here if r["nodes"] == 1 and r["ranks_per_node"] == 1), None)
            base_tps = run_row(base, None, rate_bps)["tokens_per_sec"] if base else None
            per_round[k] = {r["label"]: run_row(r, base_tps, rate_bps) for r in here}
        labels = list(dict.fromkeys(r["label"] for r in sorted(runs, key=lambda r: r["label"])))
        rows = [summarize([rr[label] for rr in per_round.values() if label in rr]) for label in labels]
        multi = [r for r in rows if r["nodes"] > 1 and r["comm"] == "fp32"]  # local SGD: comm local<H>...
        alpha = multi[0]["alpha"] if multi else None
        params = next((r["summary"].get("params") for r in runs if r["summary"].get("params")), None)
        auto = next((r for r in rows if r["nodes"] > 1 and r["comm"] == "auto"), None)

        def within_rounds(num, den, field, per_round=per_round):
            """num/den of `field` per round (both labels present), summarized over the rounds."""
            return spread([rr[num][field] / rr[den][field] for rr in per_round.values()
                           if num in rr and den in rr and rr[den][field]])

        first = {r["label"]: r for r in runs if r["round"] == min(x["round"] for x in runs)}
        entry = {"params": params, "rows": rows, "alpha": alpha, "rounds": len(per_round),
                 "model": {k: runs[0]["config"].get(k) for k in ("depth", "n_embd", "n_head", "seq_len",
                                                                   "batch_size")} if runs else {},
                 "auto_vs_fp32": None, "auto_choice": auto["comm_chosen"] if auto else None,
                 "loss_curves": {label: [(m["step"], m["loss"]) for m in r["metrics"]]
                                 for label, r in first.items() if r["nodes"] > 1}}
        # the accuracy cost of each way of synchronizing: validation loss (held-out row groups, all ranks)
        # over fp32's, at equal tokens (the N-node runs of as many steps as the fp32 run), within each round.
        # Without an N-node fp32 run, 1 node x N ranks in fp32 is the same optimization (same world size,
        # data split and all-reduced gradients; only the wire differs), so it stands in.
        fp32 = multi[0] if multi else next((r for r in rows if r["comm"] == "fp32" and r["nodes"] == 1
                                            and r["ranks_per_node"] > 1), None)
        entry["val_reference"] = fp32["label"] if fp32 else None
        entry["val_vs_fp32"] = {
            r["label"]: within_rounds(r["label"], fp32["label"], "val_loss") for r in rows
            if fp32 and r["nodes"] > 1 and r["label"] != fp32["label"] and r["steps"] == fp32["steps"]
            and r["nodes"] * r["ranks_per_node"] == fp32["nodes"] * fp32["ranks_per_node"]
            and r["val_loss"] is not None and fp32["val_loss"] is not None}
        if auto and multi:
            s = within_rounds(auto["label"], multi[0]["label"], "tokens_per_sec")
            entry["auto_vs_fp32_spread"], entry["auto_vs_fp32"] = s, s["median"] if s else None
        trial = next((r["summary"].get("comm_auto") for r in runs
                      if r["nodes"] > 1 and r.get("comm") == "auto" and r["summary"].get("comm_auto")), None)
        if trial:  # auto's own side-by-side steps: one run, adjacent steps, so less exposed to load drift
            entry["auto_trial"] = {"choice": trial["choice"], "speedup_vs_fp32": trial["speedup_vs_fp32"],
                                   "options": {c: {k: o.get(k) for k in ("tokens_per_sec", "step_ms",
                                                                         "alpha")}
                                               for c, o in trial["options"].items()}}
        loads = [r["load_before"][0] for r in runs if r.get("load_before")]
        cpus = machine.get("logical_cpus")
        # the bench's own ranks keep the load near the CPU count; beyond that (or a wide spread) others ran
        if loads and cpus and (max(loads) > cpus * 1.25 or max(loads) - min(loads) > 1.5):
            report["notes"].append(
                f"{size}: the machine was busy with other work (1-min load {min(loads):.1f} to "
                f"{max(loads):.1f} on {cpus} CPUs before the runs): the spread of the rounds shows how much "
                f"that moved the figures")
        solo = next((r for r in rows if r["nodes"] == 1 and r["ranks_per_node"] == 1), None)
        if multi and solo:
            # the most any --comm option can gain over fp32: a step cannot be shorter than one rank's solo
            # step (communication that cost nothing, on a core that computes as fast as alone)
            hr = within_rounds(multi[0]["label"], solo["label"], "step_ms")
            entry["comm_headroom"] = hr["median"] if hr else None
        if multi:
            entry["lowcomm_advice"] = advice(multi[0], params, study)
        if alpha is not None:
            # only at the node counts measured: no curve past what was measured
            measured = sorted({r["nodes"] for r in rows if r["ranks_per_node"] == 1})
            entry["predicted_speedup"] = {n: n / (1 + alpha * (n - 1)) for n in measured}
        report["sizes"][size] = entry
        for r in first.values():
            report["notes"] += thread_notes(r, machine)
    return report


# --- output ------------------------------------------------------------------------------------------------
def _f(x, fmt=".1f", none="-"):
    return none if x is None else format(x, fmt)


def _range(row: dict, key: str) -> str:
    if row.get(key) is None:
        return "-"
    return f"{row[key]:.2f} [{row[key + '_min']:.2f}-{row[key + '_max']:.2f}]"


def markdown(rep: dict) -> str:
    m = rep["machine"]
    lines = [f"# Scaling lab {rep['id']}", "",
             f"Link: {rep['rate'] or 'unshaped'} between {rep['nodes']} simulated nodes (" +
             (f"{rep['node_cpu']} % of one core each: the rest of each core is left to the kernel's work "
              f"for the link" if rep.get("node_cpu") else "one core each") + "), "
             f"launched via {rep['via']}. Machine: {m.get('cpu') or 'CPU model unknown'}, "
             f"{m.get('logical_cpus')} CPUs ({m.get('physical_cores')} physical cores), torch "
             f"{m.get('torch') or '?'}. Other work on the machine shares the cores: the load average "
             f"(1, 5, 15 min) before each round is in the table; the bench started at "
             f"{m.get('load_before')} and ended at {m.get('load_after')}.", ""]
    p = rep["probe"]
    if p and p.get("busbw_gbit_s"):
        lines += [f"Link probe (`nodeprobe gloo-smoke`, {p['world']} ranks, {p['bytes'] / 2**20:.0f} MiB "
                  f"fp32 all-reduce): {p['median_s'] * 1e3:.0f} ms = bus bandwidth "
                  f"{p['busbw_gbit_s']:.3f} Gbit/s; "
                  f"limit 2(N-1)/N*bytes/rate = {_f(p.get('limit_s', 0) * 1e3, '.0f')} ms, so "
                  f"**{_f(p.get('link_pct'))} % of the link limit**." +
                  (" The transfer kept " + ", ".join(f"{c:.2f}" for c in p["cores_busy"]) +
                   " of a core busy on the nodes (the probe's CPU time over its wall time): CPU a step's "
                   "compute loses while DDP overlaps the all-reduce with it on a one-core node."
                   if p.get("cores_busy") and None not in p["cores_busy"] else "") +
                  (f" The whole machine had {p['machine_cores_busy']:.2f} of its "
                   f"{m.get('logical_cpus', '?')} CPUs busy meanwhile (the kernel's "
                   f"network work included; simulated nodes share the machine with their link)."
                   if p.get("machine_cores_busy") is not None else ""), ""]
    elif p:
        lines += [f"Link probe failed: {p.get('error')}", ""]
    head = ("| run | comm | rounds | tok/s [min-max] | speedup [min-max] | efficiency [min-max] | step ms "
            "| compute ms | all-reduce ms | exposed ms (% of step) | MB/step | bus Gbit/s | limit ms "
            "| % of link | alpha | train loss | val loss | load before each round |")
    for size, e in rep["sizes"].items():
        md = e["model"]
        title = (f"## {size}: {e['params']:,} parameters (depth {md.get('depth')}, width "
                 f"{md.get('n_embd')}, seq {md.get('seq_len')}, batch {md.get('batch_size')} per rank)"
                 if e["params"] else f"## {size}")
        lines += [title, "", f"Medians of {e['rounds']} interleaved round(s); ratios taken within each "
                  "round.", "", head, "|" + "---|" * 18]
        for r in e["rows"]:
            comm = r["comm"] + (f" -> {r['comm_chosen']}" if r["comm"] == "auto" else "")
            loads = ", ".join("/".join(f"{x:.1f}" for x in lb or []) for lb in r["load_before"])
            lines.append(
                f"| {r['label']} | {comm} | {r['rounds']} | {r['tokens_per_sec']:.1f} "
                f"[{r['tokens_per_sec_min']:.0f}-{r['tokens_per_sec_max']:.0f}] | {_range(r, 'speedup')} | "
                f"{_range(r, 'efficiency')} | {r['step_ms']:.0f} | {r['compute_ms']:.0f} | "
                f"{r['allreduce_ms']:.0f} | {r['exposed_ms']:.0f} ({r['exposed_pct']:.0f} %) | "
                f"{r['allreduce_bytes'] / 1e6:.1f} | {_f(r['busbw_gbit_s'], '.3f')} | "
                f"{_f(r['limit_ms'], '.0f')} | "
                f"{_f(r['link_pct'])} | {_f(r['alpha'], '.3f')} | {r['loss_last']:.3f} | "
                f"{_f(r['val_loss'], '.4f')} | {loads} |")
        lines.append("")
        local = [r for r in e["rows"] if r.get("sync_ms") is not None]
        if local:
            per = ", ".join(f"{r['label']} {r['sync_ms']:.0f} ms for {r['sync_bytes'] / 1e6:.0f} MB" +
                            (" blocked (the transfer runs under the next steps)" if r.get("sync_overlapped")
                             else f" after {r['sync_wait_ms']:.0f} ms waiting for the slower rank"
                             if r.get("sync_wait_ms") is not None else " (the wait for the slower rank "
                             "included: not measured apart)") for r in local)
            lines += ["Low-communication rows: step, compute, all-reduce and exposed ms and MB/step are "
                      "means per step, the syncs included; bus Gbit/s, limit and % of link are those of one "
                      f"sync (median): {per}.", ""]
        if e.get("val_vs_fp32"):
            base = e["val_reference"]
            vals = ", ".join(f"{label} {100 * (v['median'] - 1):+.2f} % [{100 * (v['min'] - 1):+.2f} to "
                             f"{100 * (v['max'] - 1):+.2f}]" for label, v in e["val_vs_fp32"].items() if v)
            lines += [f"Validation loss at equal tokens (held-out row groups, mean over all ranks) against "
                      f"{base}, within each round: {vals}.", ""]
        if e["alpha"] is not None:
            pred = ", ".join(f"{n}: {s:.2f}" for n, s in e["predicted_speedup"].items())
            lines += [f"alpha (fp32, {rep['nodes']} nodes) = {e['alpha']:.3f}; N/(1+alpha(N-1)) at the "
                      f"measured node counts: {pred}.", ""]
        if e.get("auto_trial"):
            t = e["auto_trial"]
            opts = ", ".join(f"{c} {o['tokens_per_sec']:.1f} tok/s (alpha {o['alpha']})"
                             for c, o in t["options"].items())
            lines += [f"`--comm auto` trial (adjacent steps of one run): {opts} -> {t['choice']}, "
                      f"{t['speedup_vs_fp32']:.2f}x fp32.", ""]
        if e["auto_vs_fp32"] is not None:
            s = e["auto_vs_fp32_spread"]
            lines += [f"`--comm auto` chose {e['auto_choice']}: {e['auto_vs_fp32']:.2f}x [{s['min']:.2f}-"
                      f"{s['max']:.2f}] the tokens/s of fp32 on {rep['nodes']} nodes (steady state, trial "
                      f"steps left out; within each round, {s['n']} round(s)).", ""]
        if e.get("comm_headroom") is not None:
            lines += [f"Headroom: the {rep['nodes']}x1 fp32 step is {e['comm_headroom']:.2f}x the 1x1 step, "
                      f"so no way of sending gradients can make a step more than {e['comm_headroom']:.2f}x "
                      f"faster than fp32 here (communication that cost nothing).", ""]
        if e.get("lowcomm_advice"):
            lines += lowcomm_advice.markdown(e["lowcomm_advice"], f"### {size}: communication")[1:] + [""]
    if rep["notes"]:
        lines += ["## Notes", ""] + [f"- {n}" for n in rep["notes"]] + [""]
    lines += ["Definitions: bench/scaling_report.py. Raw data: raw/<size>/<run>/<node>/ (trainer out "
              "dirs).", ""]
    return "\n".join(lines)


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
