"""Low-communication training against per-step fp32 DDP at equal tokens: `make bench-lowcomm`.

    .venv/bin/python bench/lowcomm.py [--steps 1600] [--seeds 1337 1338] [--modes ddp h16-avg ...] [--id ID]
                                      [--corpus builtin|stdlib]

Every mode in MODES trains the same model (0.46M parameters: depth 2, width 128, seq 128, 4 sequences per
rank per step) for the same steps, so on the same tokens, with 2 ranks on this machine
(bench/local_sgd.py's launcher: torchrun --standalone, gloo over loopback, 1 thread per rank). Loss at
equal tokens does not depend on the link, so loopback is enough to judge it. Each seed (model init) is a
round: the reference (`ddp`, --sync-every 1, fp32) and every mode, the order reversed every other round;
each ratio is taken within its round, then summarized as median with min-max over the rounds.

Per mode: the validation loss at the end (the trainer's own held-out row groups, every rank holds the
synchronized model after the last step) over the reference's, its curve (evaluated every tenth of the
run), the bytes each rank handed to the collectives per step as counted by the trainer (metrics records'
`allreduce_bytes`, warm-up steps included) over the reference's, the outer steps (syncs after the
warm-up) and the tokens. Before the runs, a micro-benchmark (bench/lowcomm_wire.py) measures what gloo
moves on loopback for one sync of this model in fp32, bf16 (all-reduce) and int8/int4 (all-gather of codes
and scales).

The corpus (--corpus): `builtin`, the trainer's templated generated documents (its validation loss
flattens near 0.31 nats per byte, where modes may all meet), or `stdlib`, the running Python's standard
library source (bench/stdlib_corpus.py: real code and docstrings, no download), far harder to learn.

Runs are kept in runs/bench-lowcomm-<id>/runs.json as they finish: the same --id skips the (mode, seed)
runs already there (of the same corpus), so modes can be added to a study. Writes bench/results/lowcomm/
(--corpus stdlib: bench/results/lowcomm-stdlib/; or --results): report.json, report.md, curves.png.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import stdlib_corpus  # noqa: E402
from bench.local_sgd import spread, torchrun_trainer  # noqa: E402
from bench.lowcomm_heldout import Heldout, final_checkpoint, final_val_loss  # noqa: E402
from bench.lowcomm_wire import wire_bench  # noqa: E402
from bench.scaling_lab import machine_info  # noqa: E402

BATCH, SEQ, RANKS, EVAL_BATCHES = 4, 128, 2, 32
MODEL = ["--depth", "2", "--seq-len", str(SEQ), "--batch-size", str(BATCH), "--threads", "1", "--lr", "3e-3",
         "--eval-batches", str(EVAL_BATCHES), "--timing-warmup-steps", "2"]
AVG = ["--outer-lr", "1", "--outer-momentum", "0"]  # plain parameter averaging (local SGD)
# name: (label, flags, the mode it changes one thing of: its numbers are compared with that one);
# {warm} is a 25th of the run's steps (64 of 1,600)
MODES = {
    "ddp": ("per-step DDP, fp32 (reference)", [], None),
    "h16-avg": ("H16, averaging, fp32", ["--sync-every", "16", *AVG], None),
    "h8-avg-bf16": ("H8, averaging, bf16", ["--sync-every", "8", "--comm", "bf16", *AVG], "h16-avg"),
    # the same, each sync under the next 8 steps (it lands one sync late): what hides the transfer on a link
    "h8-avg-bf16-ovl": ("H8, averaging, bf16, overlapped (--sync-overlap)",
                        ["--sync-every", "8", "--comm", "bf16", "--sync-overlap", *AVG], "h8-avg-bf16"),
    # Streaming DiLoCo's fragments: 1/4 of the model every 2 steps in turn (each every 8): the same bytes
    "h8-avg-bf16-f4": ("H8, averaging, bf16, 4 fragments (--sync-fragments 4)",
                       ["--sync-every", "8", "--comm", "bf16", "--sync-fragments", "4", *AVG], "h8-avg-bf16"),
    # ... each fragment's sync under the next 2 steps (it lands at the next fragment's turn)
    "h8-avg-bf16-f4-ovl": ("H8, averaging, bf16, 4 fragments, overlapped",
                           ["--sync-every", "8", "--comm", "bf16", "--sync-fragments", "4", "--sync-overlap",
                            *AVG], "h8-avg-bf16-ovl"),
    # ... in 8 fragments: one each step, landing one step late
    "h8-avg-bf16-f8-ovl": ("H8, averaging, bf16, 8 fragments, overlapped",
                           ["--sync-every", "8", "--comm", "bf16", "--sync-fragments", "8", "--sync-overlap",
                            *AVG], "h8-avg-bf16-f4-ovl"),
    # the Quadratic Synchronization Rule (Gu et al. 2024): a sync every 4 steps at the peak learning rate,
    # every 4 x (peak/lr)^2 as it decays (cosine to 0.1 of it): 167 syncs in 1,600 steps, fewer than H8's 200
    "h4-qsr-avg-bf16": ("QSR from H4, averaging, bf16 (--sync-schedule qsr)",
                        ["--sync-every", "4", "--sync-schedule", "qsr", "--comm", "bf16", *AVG],
                        "h8-avg-bf16"),
    "h4-qsr-avg-bf16-f4-ovl": ("QSR from H4, averaging, bf16, 4 fragments, overlapped",
                               ["--sync-every", "4", "--sync-schedule", "qsr", "--comm", "bf16",
                                "--sync-fragments", "4", "--sync-overlap", *AVG], "h8-avg-bf16-f4-ovl"),
    # H ~ 1/lr, which the QSR paper compares with: from H5, 179 syncs
    "h5-invlr-avg-bf16": ("H5 x peak/lr, averaging, bf16 (--sync-schedule inverse-lr)",
                          ["--sync-every", "5", "--sync-schedule", "inverse-lr", "--comm", "bf16", *AVG],
                          "h8-avg-bf16"),
    "h16-diloco": ("H16, Nesterov outer lr 0.7 momentum 0.9 (DiLoCo)", ["--sync-every", "16"], "h16-avg"),
    "h16-nest-1-0.5": ("H16, Nesterov outer lr 1.0 momentum 0.5",
                       ["--sync-every", "16", "--outer-lr", "1", "--outer-momentum", "0.5"], "h16-avg"),
    "h16-avg-int8": ("H16, averaging, int8", ["--sync-every", "16", "--comm", "int8", *AVG], "h16-avg"),
    "h16-avg-int8-warm": ("H16, averaging, int8, per-step fp32 warm-up (1/25 of the steps)",
                          ["--sync-every", "16", "--sync-every-after", "{warm}", "--comm", "int8", *AVG],
                          "h16-avg-int8"),
    "h16-avg-int4": ("H16, averaging, int4", ["--sync-every", "16", "--comm", "int4", *AVG], "h16-avg-int8"),
    # int4 is 7.5x fewer bytes than fp32: H14 is the fewest local steps at >= 100x (1/105)
    "h14-avg-int4": ("H14, averaging, int4", ["--sync-every", "14", "--comm", "int4", *AVG], "h16-avg-int4"),
    # post-local SGD at >= 16x fewer bytes: 64 per-step DDP steps, then a sync every 64 (1/18 at 1,600 steps)
    "h64-avg-warm": ("H64, averaging, fp32, per-step warm-up (1/25 of the steps)",
                     ["--sync-every", "64", "--sync-every-after", "{warm}", *AVG], "h16-avg"),
}
# what a plain `make bench-lowcomm` runs (2 seeds x 4 runs): the settings docs/scaling.md recommends at 16x
# fewer bytes, on a slow link (its sync hidden under the steps) and at 100x (measured on --corpus stdlib);
# the others were measured with --modes
DEFAULT_MODES = ("h8-avg-bf16", "h8-avg-bf16-f4-ovl", "h14-avg-int4")
TARGETS = [(16, 0.01), (100, 0.03)]  # (bytes per step at least this many times fewer, val loss within)
# corpus: (what it is, its shard folder, where its report goes by default); each is prepared once, reused
CORPORA = {
    "builtin": ("the trainer's built-in templated corpus (trainer/data/corpus.py, seed 0)",
                REPO / "runs" / "bench-lowcomm-data", REPO / "bench" / "results" / "lowcomm"),
    "stdlib": ("the running Python's standard library source (bench/stdlib_corpus.py)",
               REPO / "runs" / "bench-lowcomm-data-stdlib" / "shards",
               REPO / "bench" / "results" / "lowcomm-stdlib"),
}
BUILTIN_DOCS, ROWS_PER_GROUP, GROUPS_PER_SHARD = 16384, 64, 16


def flags_of(mode: str, steps: int) -> list[str]:
    extra = [f.format(warm=steps // 25) for f in MODES[mode][1]]
    return [*extra, "--allow-local-sgd"] if extra else []


# --- the data -----------------------------------------------------------------------------------------

def shard_stats(data: Path) -> dict:
    """What a shard folder holds: documents and bytes (UTF-8) in all, the held-out row groups (the
    trainer's automatic split: the last 1 in 16) and their bytes, the tokens (BOS + bytes per document)
    of each rank's training row groups (rank r reads r, r + RANKS, ...), its digest."""
    import pyarrow.parquet as pq

    from trainer.data.heldout import held_out_count
    from trainer.data.shards import open_dataset

    ds = open_dataset(data)
    sizes = []  # (documents, bytes) per row group, in manifest order
    for fname, local in ds.row_groups:
        texts = pq.ParquetFile(data / fname).read_row_group(local, columns=["text"]).column(0).to_pylist()
        sizes.append((len(texts), sum(len(t.encode("utf-8")) for t in texts)))
    val = held_out_count(-1, len(sizes))
    train = sizes[:len(sizes) - val]
    return {"documents": sum(n for n, _ in sizes), "bytes": sum(b for _, b in sizes),
            "row_groups": len(sizes), "val_row_groups": val,
            "val_bytes": sum(b for _, b in sizes[len(train):]),
            "train_tokens_per_rank": [sum(n + b for n, b in train[r::RANKS]) for r in range(RANKS)],
            "digest": ds.digest}


def prepare_corpus(corpus: str) -> tuple[Path, dict]:
    """The corpus's shard folder (written when missing or out of date) and what it holds."""
    from trainer.data.shards import prepare

    label, data, _ = CORPORA[corpus]
    info = {"name": corpus, "label": label}
    if corpus == "stdlib":
        source = data.parent / "source"
        info["source"] = stdlib_corpus.write_source(source)
        print(prepare(data, source, None, ROWS_PER_GROUP, GROUPS_PER_SHARD, seed=0), flush=True)
    elif not (data / "manifest.json").exists():
        print(prepare(data, None, BUILTIN_DOCS, ROWS_PER_GROUP, GROUPS_PER_SHARD, seed=0), flush=True)
    return data, info | shard_stats(data)


def describe_corpus(c: dict, run_tokens: int) -> str:
    """The report's sentence on the corpus: what it is, its size, whether a run reads any byte twice."""
    s = c.get("source")
    src = (f"{s['files']:,} files, {s['source_bytes']:,} bytes of Python {s['python']} source under "
           f"{s['root']} cut into {s['documents']:,} documents of about {s['chunk_bytes']:,} bytes; "
           if s else "")
    have = c["train_tokens_per_rank"]
    twice = "no token twice" if run_tokens // RANKS + 1 <= min(have) else "some more than once"
    reads = (f"each rank reads {run_tokens // RANKS:,} tokens, its training row groups hold "
             f"{' and '.join(f'{t:,}' for t in have)}: {twice}")
    return (f"Corpus: {c['label']}: {src}{c['documents']:,} documents, {c['bytes']:,} bytes written in "
            f"{c['row_groups']} whole row groups of {ROWS_PER_GROUP} (digest {c['digest'][:16]}), the last "
            f"{c['val_row_groups']} held out ({c['val_bytes']:,} bytes); {reads}.")


# --- the runs ------------------------------------------------------------------------------------------

def run_mode(data: Path, out: Path, mode: str, seed: int, steps: int, corpus: str) -> dict:
    """One trainer run; what the study needs from its summary and metrics."""
    eval_every = max(1, steps // 10) * BATCH * SEQ * RANKS
    load1 = round(os.getloadavg()[0], 2)
    t0 = time.perf_counter()
    s = torchrun_trainer(data, out, ["--steps", str(steps), "--seed", str(seed), "--log-every", str(steps),
                                     "--eval-every-tokens", str(eval_every), *MODEL, *flags_of(mode, steps)])
    recs = [json.loads(ln) for ln in (out / "metrics.rank0.jsonl").read_text().splitlines() if ln]
    lsgd = s.get("local_sgd") or {}
    return {"mode": mode, "seed": seed, "steps": steps, "corpus": corpus, "val_loss": s["val_loss"],
            "val_curve": s["val_curve"],
            "bytes_per_step": sum(r["allreduce_bytes"] for r in recs) / len(recs),
            "outer_steps": lsgd.get("syncs", steps) // lsgd.get("fragments", 1),  # each parameter's syncs
            "tokens": s["tokens_seen"], "params": s["params"],
            "tokens_per_sec": s["tokens_per_sec"], "wall_s": round(time.perf_counter() - t0, 1),
            "load1": load1}


def corpus_of(run: dict) -> str:
    return run.get("corpus", "builtin")  # runs recorded before --corpus existed trained on the built-in one


def joined(ids: list[str]) -> list[dict]:
    """The runs of other study folders (--join), to report beside this one's; their reference runs too."""
    out = []
    for i in ids:
        saved = REPO / "runs" / f"bench-lowcomm-{i}" / "runs.json"
        if not saved.exists():
            raise SystemExit(f"bench: --join {i}: {saved} does not exist; give the --id of a finished study")
        out += json.loads(saved.read_text())
    return out


def study(args, work: Path, data: Path) -> list[dict]:
    """Every (mode, seed) not yet in work/runs.json for this corpus, the reference first in each round."""
    saved = work / "runs.json"
    runs = json.loads(saved.read_text()) if saved.exists() else []
    have = {(r["mode"], r["seed"], r["steps"]) for r in runs if corpus_of(r) == args.corpus}
    modes = ["ddp", *[m for m in args.modes if m != "ddp"]]
    for n, seed in enumerate(args.seeds):
        order = modes if n % 2 == 0 else ["ddp", *reversed(modes[1:])]
        for mode in order:
            if (mode, seed, args.steps) in have:
                continue
            out = raw_dir(work, args.corpus, mode, seed, args.steps)
            out.parent.mkdir(parents=True, exist_ok=True)
            r = run_mode(data, out, mode, seed, args.steps, args.corpus)
            print(f"seed {seed} {mode}: val {r['val_loss']:.4f}, {r['bytes_per_step']:,.0f} B/step, "
                  f"{r['outer_steps']} outer steps, {r['wall_s']} s, load {r['load1']}", flush=True)
            runs.append(r)
            saved.write_text(json.dumps(runs, indent=1) + "\n")
    every_run, runs = runs, [r for r in runs if corpus_of(r) == args.corpus]
    if score_on_heldout(runs, work, data, args.corpus):
        saved.write_text(json.dumps(every_run, indent=1) + "\n")
    have = {(r["mode"], r["seed"], r["steps"]) for r in runs}
    runs += [r for r in joined(args.join) if corpus_of(r) == args.corpus
             and (r["mode"], r["seed"], r["steps"]) not in have]
    return [r for r in runs if r["steps"] == args.steps and r["seed"] in args.seeds]


def raw_dir(work: Path, corpus: str, mode: str, seed: int, steps: int) -> Path:
    """A run's trainer --out (builtin: the names it always had)."""
    return work / "raw" / f"{'' if corpus == 'builtin' else corpus + '-'}{mode}-s{seed}-{steps}"


def score_on_heldout(runs: list[dict], work: Path, data: Path, corpus: str, seq_len: int = SEQ) -> bool:
    """Each run's `val_loss` becomes its final model's on the whole held-out set (bench/lowcomm_heldout.py);
    the trainer's, on its first EVAL_BATCHES x BATCH sequences, stays as `val_loss_in_run`. Runs scored
    before keep their numbers; a run whose checkpoint is gone keeps the trainer's. True if any changed."""
    todo = [r for r in runs if "val_loss_in_run" not in r and
            final_checkpoint(raw_dir(work, corpus, r["mode"], r["seed"], r["steps"]))]
    held = Heldout(data, seq_len) if todo else None
    for r in todo:
        out = raw_dir(work, corpus, r["mode"], r["seed"], r["steps"])
        r["val_loss_in_run"], r["val_loss"] = r["val_loss"], final_val_loss(out, held)
        r["val_sequences"] = held.sequences
        print(f"seed {r['seed']} {r['mode']}: val {r['val_loss']:.4f} on {held.sequences} held-out "
              f"sequences ({r['val_loss_in_run']:.4f} on the first {EVAL_BATCHES * BATCH})", flush=True)
    return bool(todo)


def heldout_words(runs: list[dict], corpus: dict) -> str:
    """What the study's validation loss was measured on."""
    scored = {r.get("val_sequences") for r in runs}
    groups = corpus["val_row_groups"]
    first = f"the first {EVAL_BATCHES * BATCH} sequences of the {groups} held-out row groups"
    if scored == {None}:
        return f"validation loss on {first} at the end of each run"
    return (f"validation loss of each run's final model on {max(s or 0 for s in scored):,} sequences spread "
            f"evenly over the {groups} held-out row groups (bench/lowcomm_heldout.py"
            + ("" if None not in scored else "; runs without a kept checkpoint: the trainer's, on " + first)
            + f"); the curves: the trainer's evaluations on {first}")


# --- the report ---------------------------------------------------------------------------------------

def summarize(runs: list[dict]) -> dict:
    """Per mode: the ratios to the reference of the same seed, median with min-max over seeds."""
    ref = {r["seed"]: r for r in runs if r["mode"] == "ddp"}
    out = {}
    for mode in [m for m in MODES if any(r["mode"] == m for r in runs)]:
        mine = [r for r in runs if r["mode"] == mode and r["seed"] in ref]
        if not mine:
            continue
        label, _, vs = MODES[mode]
        bytes_ratio = statistics.median(r["bytes_per_step"] / ref[r["seed"]]["bytes_per_step"] for r in mine)
        out[mode] = {"label": label, "flags": flags_of(mode, mine[0]["steps"]), "compared_with": vs,
                     "bytes_per_step": statistics.median(r["bytes_per_step"] for r in mine),
                     "bytes_per_step_vs_ddp": bytes_ratio, "fewer_bytes": 1 / bytes_ratio,
                     "val_loss_vs_ddp": spread([r["val_loss"] / ref[r["seed"]]["val_loss"] for r in mine]),
                     "val_loss": spread([r["val_loss"] for r in mine]),
                     "outer_steps": mine[0]["outer_steps"], "tokens": mine[0]["tokens"],
                     "seeds": sorted(r["seed"] for r in mine)}
    return out


def targets(modes: dict) -> list[dict]:
    """Per target: the measured mode with the lowest median loss ratio among those with enough fewer bytes."""
    rows = []
    for fewer, within in TARGETS:
        fit = {m: s for m, s in modes.items() if m != "ddp" and s["fewer_bytes"] >= fewer}
        best = min(fit, key=lambda m: fit[m]["val_loss_vs_ddp"]["median"]) if fit else None
        rows.append({"fewer_bytes": fewer, "val_loss_within": within, "best_mode": best,
                     "val_loss_vs_ddp": fit[best]["val_loss_vs_ddp"] if best else None,
                     "met": bool(best) and fit[best]["val_loss_vs_ddp"]["median"] <= 1 + within})
    return rows


def verdict(modes: dict, mode: str) -> str:
    """Does the one thing this mode changes help? Against the mode it changes, in medians of the loss
    ratio; a difference within the largest spread over seeds of any mode in the study is no gain (a mode
    run with one seed has no spread of its own)."""
    vs = modes[mode]["compared_with"]
    if vs is None or vs not in modes:
        return ""
    a, b = modes[mode]["val_loss_vs_ddp"], modes[vs]["val_loss_vs_ddp"]
    d = a["median"] - b["median"]
    noise = max(m["val_loss_vs_ddp"]["max"] - m["val_loss_vs_ddp"]["min"] for m in modes.values())
    word = "helps" if d < -noise else "hurts" if d > noise else "no clear difference"
    return f"{d * 100:+.1f} pt vs {vs}: {word}"


def pct(x: dict) -> str:
    def p(v):
        return f"{(v - 1) * 100:+.1f} %"
    return f"{p(x['median'])} ({p(x['min'])} to {p(x['max'])})"


def write_md(rep: dict) -> str:
    modes, m = rep["modes"], rep["machine"]
    lines = [f"# Low-communication training vs per-step fp32 DDP at equal tokens ({rep['when']})", "",
             rep["setup"], "",
             "| mode | flags | bytes/step vs DDP | val loss vs DDP, median (min to max) | seeds | val loss "
             "| outer steps | tokens | the one change |", "|---|---|---|---|---|---|---|---|---|"]
    for mode, s in modes.items():
        v = s["val_loss"]
        lines.append(f"| {s['label']} | `{' '.join(s['flags']) or '--sync-every 1'}` | "
                     f"1/{s['fewer_bytes']:.1f} | {pct(s['val_loss_vs_ddp'])} | {len(s['seeds'])} | "
                     f"{v['median']:.4f} | "
                     f"{s['outer_steps']} | {s['tokens']:,} | {verdict(modes, mode)} |")
    skipped = [f"{m} ({MODES[m][0]})" for m in MODES if m not in modes]
    if skipped:
        lines += ["", "Defined in bench/lowcomm.py but not run in this study: " + "; ".join(skipped) + "."]
    lines += ["", "Targets (medians over seeds, the reference in the same seed):", ""]
    for t in rep["targets"]:
        got = (f"best {t['best_mode']}: {pct(t['val_loss_vs_ddp'])} -> {'met' if t['met'] else 'not met'}"
               if t["best_mode"] else "no mode measured with so few bytes")
        lines.append(f"- at >= {t['fewer_bytes']}x fewer bytes per step, val loss within "
                     f"{t['val_loss_within'] * 100:.0f} %: {got}")
    w = rep.get("wire")
    if w:
        lines += ["", f"gloo on loopback, one sync of this model ({w['numel']:,} values), median of "
                  f"{w['reps']} (2 processes, 1 thread each):", "",
                  "| what | bytes per rank | ms | Gbit/s of payload |", "|---|---|---|---|"]
        lines += [f"| {name} | {o['bytes']:,} | {o['ms_median']:.2f} | {o['gbit_per_s']:.2f} |"
                  for name, o in w["ops"].items()]
    lines += ["", f"Machine: {m.get('cpu')}, {m.get('logical_cpus')} logical CPUs (shared), torch "
              f"{m.get('torch')}, load average {m.get('load_before')} before, {m.get('load_after')} after.",
              "Plot: curves.png (validation loss over tokens, median over seeds; right: over the reference).",
              ""]
    return "\n".join(lines)


def plot(runs: list[dict], modes: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    def median_curve(mode):
        curves = [r["val_curve"] for r in runs if r["mode"] == mode]
        n = min(len(c) for c in curves)
        x = [p[0] for p in curves[0][:n]]
        return np.array(x), np.median([[p[1] for p in c[:n]] for c in curves], axis=0)

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    rx, ry = median_curve("ddp")
    for mode, s in modes.items():
        x, y = median_curve(mode)
        style = "k-" if mode == "ddp" else "-"
        a.plot(x, y, style, marker=".", label=f"{s['label']} (1/{s['fewer_bytes']:.0f} bytes)")
        b.plot(x, y / np.interp(x, rx, ry), style, marker=".")
    a.set(xlabel="tokens", ylabel="validation loss", title="validation loss (median over seeds)")
    b.set(xlabel="tokens", ylabel="val loss / per-step DDP", title="over per-step fp32 DDP")
    b.axhline(1.01, color="gray", ls=":", lw=1)
    b.axhline(1.03, color="gray", ls="--", lw=1)
    a.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=1600, help="steps per run (all modes: equal tokens)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1337, 1338], help="one round per seed")
    ap.add_argument("--modes", nargs="+", default=list(DEFAULT_MODES), choices=list(MODES),
                    help="modes to run (the reference ddp always runs; default: the recommended settings)")
    ap.add_argument("--id", default=time.strftime("%Y%m%d-%H%M%S"),
                    help="study folder runs/bench-lowcomm-ID (an existing one: its finished runs are kept)")
    ap.add_argument("--join", nargs="*", default=[], metavar="ID",
                    help="also report the runs of these study folders (same --steps and --seeds)")
    ap.add_argument("--corpus", default="builtin", choices=list(CORPORA),
                    help="builtin: the trainer's templated corpus; stdlib: this Python's standard library "
                         "source")
    ap.add_argument("--results", default=None,
                    help="where report.json, report.md, curves.png go (default: bench/results/lowcomm/, "
                         "bench/results/lowcomm-stdlib/ for --corpus stdlib)")
    ap.add_argument("--wire-reps", type=int, default=30,
                    help="repetitions of the gloo micro-benchmark (0: skip)")
    args = ap.parse_args(argv)
    data, corpus = prepare_corpus(args.corpus)
    work = REPO / "runs" / f"bench-lowcomm-{args.id}"
    work.mkdir(parents=True, exist_ok=True)
    machine = machine_info() | {"load_before": [round(x, 2) for x in os.getloadavg()]}
    wire = None
    if args.wire_reps:
        from trainer.data.tokenizer import VOCAB_SIZE
        from trainer.model import GPTConfig, param_count

        gcfg = GPTConfig(vocab_size=VOCAB_SIZE, seq_len=SEQ, n_layer=2, n_embd=128, n_head=2)
        wire = wire_bench(param_count(gcfg), args.wire_reps)
    runs = study(args, work, data)
    machine["load_after"] = [round(x, 2) for x in os.getloadavg()]
    modes = summarize(runs)
    fewest_outer = min(s["outer_steps"] for s in modes.values())
    rep = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine, "wire": wire,
           "steps": args.steps, "seeds": args.seeds, "model_args": MODEL, "corpus": corpus, "modes": modes,
           "targets": targets(modes), "runs": runs,
           "setup": (f"2 ranks, torchrun --standalone on this machine, gloo over loopback, 1 thread per "
                     f"rank; {runs[0]['params']:,} parameters (depth 2, width 128), seq {SEQ}, {BATCH} "
                     f"sequences per rank per step, lr 3e-3 cosine, {args.steps} steps = "
                     f"{runs[0]['tokens']:,} tokens per run (at least {fewest_outer} outer steps); seeds "
                     f"{', '.join(map(str, args.seeds))} (one round each, the reference in every round); "
                     f"{heldout_words(runs, corpus)}; bytes per "
                     f"step: what each rank handed to the collectives, counted by the trainer, averaged "
                     f"over all steps. "
                     f"{describe_corpus(corpus, runs[0]['tokens'])}")}
    results = Path(args.results or CORPORA[args.corpus][2])
    results.mkdir(parents=True, exist_ok=True)
    (results / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    (results / "report.md").write_text(write_md(rep))
    plot(runs, modes, results / "curves.png")
    print(write_md(rep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
