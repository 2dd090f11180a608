"""The results tables of the docs pages, generated from bench/results/ (never typed by hand).

A table lives in a docs page between two markers naming its source:

    <!-- table: lowcomm -->
    | ... |
    <!-- /table -->

    .venv/bin/python bench/docs_tables.py          # rewrite every marked table from its report.json files
    .venv/bin/python bench/docs_tables.py --check  # exit 1 naming each table that differs

tests/bench/test_docs_tables.py runs the check, so a table in the docs is always its report's.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from lowcomm import MODES as STUDY_MODES  # noqa: E402  (the long study's settings)
from run_labels import LOCAL, comm_flags  # noqa: E402  (the low-communication mode's run labels)
from shard import capacity_summary, speed_rows  # noqa: E402  (make bench-shard's own lines)

from trainer.config import TrainConfig  # noqa: E402  (DiLoCo's outer step: the trainer's defaults)

BLOCK = re.compile(r"(<!-- table: (?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /table -->)", re.S)
OPENING = "<!-- table:"


def spread(x: dict, fmt: str = "{:.1f}") -> str:
    return f"{fmt.format(x['median'])} [{fmt.format(x['min'])}-{fmt.format(x['max'])}]"


def percent(v: float) -> str:
    return f"{(v - 1) * 100:+.1f} %"


def relative(x: dict) -> str:
    if x["n"] == 1:
        return percent(x["median"])
    return f"{percent(x['median'])} [{percent(x['min'])} to {percent(x['max'])}]"


def loss_change(x: dict) -> str:
    """A validation-loss ratio; its range only where the rounds differ (a seeded run's loss is the same)."""
    return percent(x["median"]) if x["min"] == x["max"] else relative(x)


def times(x: dict) -> str:
    return f"{x['median']:.2f}x [{x['min']:.2f}-{x['max']:.2f}]"


def of_rounds(row: dict, key: str) -> dict:
    """A scaling-lab run's figure over its rounds (bench/scaling_report.py: key, key_min, key_max)."""
    return {"median": row[key], "min": row[f"{key}_min"], "max": row[f"{key}_max"]}


def speedup(row: dict) -> str:
    """A scaling-lab run's tokens/s against 1 node: median [min-max] of its rounds, or of its one round."""
    return f"{row['speedup']:.2f}x" if row["rounds"] == 1 else times(of_rounds(row, "speedup"))


def sync_label(comm: str) -> str:
    """local<H>[-bf16][-avg][-ovl][-f<F>][-qsr|-invlr] (bench/scaling_lab.py's run label) in words."""
    m = LOCAL.fullmatch(comm)
    h, bf16, avg, ovl = int(m[1]), bool(m[2]), bool(m[3]), bool(m[4])
    outer = "averaging" if avg else f"DiLoCo {TrainConfig.outer_lr:g}/{TrainConfig.outer_momentum:g}"
    every = {"qsr": f"every {h} x (peak/lr)^2 steps (QSR)", "invlr": f"every {h} x peak/lr steps"}.get(
        m[6], f"every {h} steps")
    return (f"{every}, {outer}, {'bf16' if bf16 else 'fp32'}" +
            (f", in {m[5]} fragments" if m[5] else "") + (", overlapped" if ovl else ""))


def sync_order(row: dict) -> tuple:
    """By H, then plain averaging before DiLoCo, 16-bit syncs before fp32."""
    m = LOCAL.fullmatch(row["comm"])
    return int(m[1]), not m[3], not m[2]


def run_flags(comm: str) -> str:
    """The trainer flags of a scaling-lab run label (bench/scaling_lab.py), the defaults left out."""
    flags = [f for f in comm_flags(comm) if f != "--allow-local-sgd"]
    return " ".join(flags[2:] if flags[:2] == ["--comm", "fp32"] else flags)


def local_rows(size: dict) -> list[dict]:
    return sorted((r for r in size["rows"] if LOCAL.fullmatch(r["comm"])), key=sync_order)


def lowcomm(rep: dict) -> list[str]:
    """bench/lowcomm.py's modes against per-step fp32 DDP (the reference row left out)."""
    rows = ["| mode | bytes per step vs DDP | val loss vs per-step fp32 DDP, median [min to max] | seeds "
            "| outer steps |", "|---|---|---|---|---|"]
    for mode in rep["modes"].values():
        flags = " ".join(f for f in mode["flags"] if f != "--allow-local-sgd")
        if not flags or flags == "--sync-every 1":
            continue
        rows.append(f"| {mode['label']} (`{flags}`) | 1/{mode['fewer_bytes']:.1f} | "
                    f"{relative(mode['val_loss_vs_ddp'])} | {len(mode['seeds'])} | {mode['outer_steps']} |")
    return rows


def relaunch(rep: dict) -> list[str]:
    """bench/relaunch.py: launch.yml against bare ssh + tmux, and a no-change prepare."""
    rows = ["| hosts | launch.yml -e ddplab_wait=true (s) | bare ssh+tmux (s) | ratio "
            "| no-change prepare.yml (s) |", "|---|---|---|---|---|"]
    for r in rep["results"]:
        rows.append(f"| {r['hosts']} | {spread(r['launch_s'])} | {spread(r['bare_s'])} | "
                    f"{spread(r['ratio'], '{:.2f}')} | {spread(r['prepare_nochange_s'])} "
                    f"(changed {max(r['prepare_changed'])}) |")
    return rows


def distribution(rep: dict) -> list[str]:
    """bench/distribution.py: star vs relay per uplink and node count, against one copy through the uplink."""
    size = rep["size_bytes"]
    rows = [f"| control uplink (LAN {rep['lan']}) | nodes | star (s) | relay (s) "
            f"| limit: {size / 2**20:,.0f} MiB / uplink (s) | relay vs limit "
            "| bytes that left the control host, star / relay (x size) |",
            "|---|---|---|---|---|---|---|"]

    def took(m: dict | None) -> str:
        return f"{m['median_s']:.1f} [{m['min_s']:.1f}-{m['max_s']:.1f}]" if m else "-"

    def sent(m: dict | None) -> str:
        return f"{m['control_bytes_median'] / size:.2f}" if m else "-"

    for name, per_nodes in rep["scenarios"].items():
        for nodes, modes in sorted(per_nodes.items(), key=lambda kv: int(kv[0])):
            star, relay = modes.get("star"), modes.get("relay")
            limit = (star or relay)["limit_s"]
            vs_limit = f"{relay['x_limit']:.2f}x" if relay else "-"
            rows.append(f"| {rep['uplinks'][name]} | {nodes} | {took(star)} | {took(relay)} | {limit:.1f} | "
                        f"{vs_limit} | {sent(star)} / {sent(relay)} |")
    return rows


SYNC_HEADER = ["| sync | tokens/s vs 1 node [min-max] | validation loss vs per-step fp32, equal tokens |",
               "|---|---|---|"]


def local_sgd_long(long: dict, lab: dict) -> list[str]:
    """bench/scaling_lab.py's large-b1-long (96 steps, syncs every H steps) against 1 node; the per-step fp32
    row's speed is the 16-step large-b1-local lab's (scaling_lab/), its loss is the reference."""
    size = long["sizes"]["large-b1-long"]
    rows = [f"| {sync_label(r['comm'])} | {speedup(r)} | {loss_change(size['val_vs_fp32'][r['label']])} |"
            for r in local_rows(size)]
    per_step = next(r for r in lab["sizes"]["large-b1-local"]["rows"] if r["label"] == "2x1-fp32")
    rows.append(f"| every step, fp32 (`--sync-every 1`) | {per_step['speedup']:.2f}x "
                f"({per_step['steps']:.0f}-step lab below) | reference |")
    return SYNC_HEADER + rows


def study_mode_of(comm: str) -> str | None:
    """The long study's mode (bench/lowcomm.py) with the flags of a scaling-lab run label, if it has one."""
    want = sorted(f for f in comm_flags(comm) if f != "--allow-local-sgd")
    for name, (_, flags, _) in STUDY_MODES.items():
        if sorted(flags if "--comm" in flags else ["--comm", "fp32", *flags]) == want:
            return name
    return None


def lowcomm_speed(size: str):
    """A model's speed in scaling labs (their `size` rounds; the link each lab ran at) with the long study's
    loss beside each setting."""
    def make(study: dict, *labs: dict) -> list[str]:
        rows = ["| sync | tokens/s vs 1 node [min-max] | step exposed to the sync | val loss vs per-step DDP "
                "in the long study, median [min to max] | lab (link) |", "|---|---|---|---|---|"]
        for lab in labs:
            for r in local_rows(lab["sizes"][size]):
                studied = study["modes"].get(study_mode_of(r["comm"]))
                loss = relative(studied["val_loss_vs_ddp"]) if studied else "not studied"
                rows.append(f"| {sync_label(r['comm'])} (`{run_flags(r['comm'])}`) | {speedup(r)} | "
                            f"{r['exposed_pct']:.0f} % | {loss} | {lab['id']} ({lab['rate']}) |")
        return rows
    return make


def sync_overlap(overlap: dict, screen: dict) -> list[str]:
    """Overlapped syncs (large-b1-long, -ovl runs): the repeated rounds, then the screening round's others."""
    size, screened = overlap["sizes"]["large-b1-long"], screen["sizes"]["large-b1-long"]
    shown = {r["label"] for r in size["rows"]}
    rows = []
    for rep in (size, screened):
        for r in local_rows(rep):
            if rep is screened and r["label"] in shown:
                continue
            once = " (1 round)" if r["rounds"] == 1 else ""
            rows.append(f"| {sync_label(r['comm'])}{once} | {speedup(r)} | "
                        f"{loss_change(rep['val_vs_fp32'][r['label']])} |")
    return SYNC_HEADER + rows


# The runs each row of the 1 Gbit/s summary shows (a choice, not a measurement): the model's (report, size);
# the other ways of synchronizing beside per-step fp32, as (report, size, run); the runs whose validation
# loss it names by their --comm (None: the other ways', unnamed).
GBIT_ROWS = [
    (("lab", "small"), [("lab", "small", "2x1-auto")], ["2x1-bf16", "2x1-powersgd"]),
    (("lab", "large"), [("lab", "large", "2x1-auto")], None),
    (("lab", "large-b1-local"), [("lab", "large-b1-local", "2x1-local16")], None),
    (("long", "large-b1-long"), [("long", "large-b1-long", "2x1-local16-avg"),
                                 ("long", "large-b1-long", "2x1-local4-bf16-avg"),
                                 ("overlap", "large-b1-long", "2x1-local2-avg-ovl")], None),
]
COMM_NAMES = {"powersgd": "PowerSGD"}


def run_of(size: dict, label: str) -> dict:
    return next(r for r in size["rows"] if r["label"] == label)


def model_cell(name: str, size: dict) -> str:
    """Parameters and tokens per rank and step; the step count of a -long size (its runs are longer)."""
    tokens = size["model"]["batch_size"] * size["model"]["seq_len"]
    steps = f", {run_of(size, '1x1')['steps']:.0f} steps" if name.endswith("-long") else ""
    return f"{size['params'] / 1e6:.3g}M params, {tokens:,}{steps}"


def fp32_cell(fp32: dict | None) -> str:
    """2-node per-step fp32 efficiency, and its speed against 1 node where 2 nodes were slower."""
    if fp32 is None:
        return "(as above)"
    slower = f" ({fp32['speedup']:.2f}x one node)" if fp32["speedup"] < 1 else ""
    return spread(of_rounds(fp32, "efficiency"), "{:.2f}") + slower


def other_way(size: dict, run: dict) -> str:
    """Another way of synchronizing against 1 node (its efficiency); --comm auto's against fp32 as well."""
    if run["comm"] != "auto":
        return f"`{run_flags(run['comm'])}`: {speedup(run)} ({run['efficiency']:.2f})"
    return (f"`--comm auto` chose {size['auto_choice']}: {speedup(run)} ({run['efficiency']:.2f}), "
            f"{times(size['auto_vs_fp32_spread'])} fp32 (headroom {size['comm_headroom']:.2f}x)")


def scaling_1gbit(lab: dict, long: dict, overlap: dict) -> list[str]:
    """The 1 Gbit/s labs in one table: per-step fp32 on 2 nodes, the other ways of synchronizing and what they
    cost in validation loss at equal tokens (the 96-step row: scaling_lab_long/ and scaling_lab_overlap/)."""
    reps = {"lab": lab, "long": long, "overlap": overlap}
    out = ["| model, tokens per rank and step | 2-node efficiency, fp32 "
           "| best other way vs 1 node (efficiency) | val loss vs fp32 | fp32 all-reduce, % of link limit |",
           "|---|---|---|---|---|"]
    for (rep, name), picks, named in GBIT_ROWS:
        size = reps[rep]["sizes"][name]
        fp32 = next((r for r in size["rows"] if r["label"] == "2x1-fp32"), None)
        ways, losses = [], []
        for prep, pname, label in picks:
            psize = reps[prep]["sizes"][pname]
            ways.append(other_way(psize, run_of(psize, label)))
            if named is None and label in psize["val_vs_fp32"]:
                losses.append(loss_change(psize["val_vs_fp32"][label]))
        if named:
            losses = [", ".join(f"{COMM_NAMES.get(run_of(size, x)['comm'], run_of(size, x)['comm'])} "
                                f"{loss_change(size['val_vs_fp32'][x])}" for x in named)]
        if not losses:
            auto = next(r for r in size["rows"] if r["comm"] == "auto")
            losses = [f"not compared (auto ran {auto['steps']:.0f} steps, fp32 {fp32['steps']:.0f})"]
        link = f"{fp32['link_pct']:.0f} %" if fp32 else "-"
        out.append(f"| {model_cell(name, size)} | {fp32_cell(fp32)} | {'; '.join(ways)} "
                   f"| {'; '.join(losses)} | {link} |")
    return out


def shard(results: dict) -> list[str]:
    """make bench-shard: the largest model of each layout per lab, then the speed study where both fit."""
    return [*capacity_summary(results["labs"]), *(["", *speed_rows(results["speed"])] if results.get("speed")
                                                  else [])]


def tune_nanochat(rep: dict) -> list[str]:
    """bench/nanochat_compile.py: `ddplab tune` on nanochat d4, the docs' eager line against torch.compile."""
    eager, compiled = ({r["layout"]: r for r in rep["modes"][m]["rows"]} for m in ("eager", "compiled"))

    def tps(r: dict) -> str:
        if not r.get("tokens_per_sec"):
            return f"- ({r.get('note') or 'no steps'})"
        return f"{r['tokens_per_sec']:,.0f} [{r['tokens_per_sec_min']:,.0f}-{r['tokens_per_sec_max']:,.0f}]"

    def first(r: dict) -> str:
        return f"{r['first_step_ms'] / 1000:.1f}" if r.get("first_step_ms") else "-"

    def share(r: dict) -> str:
        known = r.get("allreduce_share") is not None
        return f"{r['allreduce_share'] * 100:.0f} %" if known else "not printed"

    def load(mode: str) -> str:
        start, end = rep["modes"][mode]["load"]
        return f"load {start:.0f} to {end:.0f}"

    rows = [f"| layout | eager tokens/s [min-max] ({load('eager')}) | compiled tokens/s [min-max] "
            f"({load('compiled')}) | compiled / eager | first step, eager / compiled (s) "
            "| all-reduce share |",
            "|---|---|---|---|---|---|"]
    for name, e in eager.items():
        c = compiled.get(name, {})
        ratio = (f"{c['tokens_per_sec'] / e['tokens_per_sec']:.2f}x"
                 if c.get("tokens_per_sec") and e.get("tokens_per_sec") else "-")
        rows.append(f"| {name} ({e['nodes']} x {e['procs_per_node']}) | {tps(e)} | {tps(c)} | {ratio} "
                    f"| {first(e)} / {first(c)} | {share(e)} |")
    return rows


def nanochat_rounds(rep: dict) -> list[str]:
    """bench/nanochat_rounds.py: eager and compiled nanochat d4 in interleaved rounds on 2 hosts x 1 rank."""
    modes = ("eager", "compiled")
    got = {m: [r for r in rep["rounds"] if r["mode"] == m] for m in modes}
    total = {m: rep["summary"][m] for m in modes}

    def tps(x) -> str:
        return f"{x:,.0f}" if x else "-"

    def rounds(m: str) -> str:
        return ", ".join(f"{tps(r['tokens_per_sec'])} ({r['load'][0]:.0f})" for r in got[m])

    def firsts(m: str) -> str:
        secs = sorted(r["first_step_ms"] / 1000 for r in got[m] if r["first_step_ms"])
        return f"{secs[len(secs) // 2]:.1f} [{secs[0]:.1f}-{secs[-1]:.1f}]" if secs else "-"

    def median_range(x: dict) -> str:
        return f"{tps(x['median'])} [{tps(x['min'])}-{tps(x['max'])}]"

    def loads(m: str) -> str:
        return f"{total[m]['load_min']:.0f} to {total[m]['load_max']:.0f}"

    ratio = rep["summary"]["ratio"]
    return [f"| {rep['iterations']} steps a launch, the first {rep['skip']} not counted | eager (the line) "
            "| compiled (no line, the shipped warm cache) |",
            "|---|---|---|",
            f"| tokens/s, median of {total['eager']['rounds']} / {total['compiled']['rounds']} rounds "
            f"[min-max] | {median_range(total['eager'])} | {median_range(total['compiled'])} |",
            f"| each round (load at its start) | {rounds('eager')} | {rounds('compiled')} |",
            f"| compiled / eager, round by round | | {times(ratio)} |",
            f"| first step, median of rounds [min-max] (s) | {firsts('eager')} | {firsts('compiled')} |",
            f"| load, lowest to highest | {loads('eager')} | {loads('compiled')} |",
            *first_launch(rep)]


def first_launch(rep: dict) -> list[str]:
    """What compiling costs once: the cold launch (the warm-up) against an eager launch with the smoke run,
    and the steps a compiled run makes before the steady seconds it saves repay it."""
    warm, eager = rep["warmup"], next((r for r in rep["rounds"] if r["mode"] == "eager" and r["smoke_run"]
                                       and r["tokens_per_sec"]), None)
    if eager is None:
        return []
    tokens = rep["tokens_per_step"]
    saved = tokens / rep["summary"]["eager"]["median"] - tokens / rep["summary"]["compiled"]["median"]
    extra = warm["wall_s"] - eager["wall_s"]
    repaid = (f"| the cold launch's {extra} s more, repaid at the medians' {saved:.2f} s a step | "
              f"| after {extra / saved:,.0f} steps |" if saved > 0 else
              f"| the cold launch's {extra} s more, repaid | | never: at the medians, compiled is slower |")
    return [f"| a launch with the smoke run, wall (s) (load) | {eager['wall_s']} ({eager['load'][0]:.0f} to "
            f"{eager['load'][1]:.0f}) | {warm['wall_s']} ({warm['load'][0]:.0f} to {warm['load'][1]:.0f}), "
            f"cold: the first launch of a lab |", repaid]


def report(name: str) -> Path:
    return RESULTS / name / "report.json"


# name -> (the reports the table is made from, the function making it from them)
TABLES = {"distribution": ((report("distribution"),), distribution),
          "distribution_1g": ((report("distribution-1g"),), distribution),
          "local_sgd_long": ((report("scaling_lab_long"), report("scaling_lab")), local_sgd_long),
          "lowcomm": ((report("lowcomm"),), lowcomm),
          "lowcomm_128m": ((report("lowcomm-stdlib"), report("scaling_lab_h8"), report("scaling_lab_stream"),
                            report("scaling_lab_fragments")), lowcomm_speed("large-b1-long")),
          "lowcomm_10m": ((report("lowcomm-stdlib"), report("scaling_lab_small_100mbit"),
                           report("scaling_lab_small_1gbit")), lowcomm_speed("small")),
          "lowcomm_stdlib": ((report("lowcomm-stdlib"),), lowcomm),
          "relaunch": ((report("relaunch"),), relaunch),
          "shard": ((RESULTS / "shard" / "results.json",), shard),
          "scaling_1gbit": ((report("scaling_lab"), report("scaling_lab_long"),
                             report("scaling_lab_overlap")), scaling_1gbit),
          "sync_overlap": ((report("scaling_lab_overlap"), report("scaling_lab_overlap_screen")),
                           sync_overlap),
          "tune_nanochat": ((report("tune_nanochat_simlan"),), tune_nanochat),
          "nanochat_rounds": ((report("nanochat_compile_rounds"),), nanochat_rounds),
          "nanochat_rounds_busy": ((report("nanochat_compile_rounds_busy"),), nanochat_rounds)}


def render(name: str) -> str:
    paths, make = TABLES[name]
    return "\n".join(make(*(json.loads(p.read_text()) for p in paths))) + "\n"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def refresh(text: str, where: str) -> str:
    def one(m: re.Match) -> str:
        if m["name"] not in TABLES:
            raise SystemExit(f"docs_tables: {where} names table '{m['name']}', unknown to "
                             f"bench/docs_tables.py; known: {', '.join(TABLES)}")
        return m.group(1) + render(m["name"]) + m.group(4)
    new, blocks = BLOCK.subn(one, text)
    if blocks != text.count(OPENING):
        raise SystemExit(f"docs_tables: {where} has {text.count(OPENING)} '{OPENING}' markers but "
                         f"{blocks} tables; fix: '<!-- table: NAME -->' (a-z, 0-9, _) on its own line, "
                         f"the table, then '<!-- /table -->'")
    return new


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only report the tables that differ (exit 1)")
    args = ap.parse_args(argv)
    stale = []
    for page in pages():
        text = page.read_text()
        new = refresh(text, str(page.relative_to(REPO)))
        if new != text:
            stale.append(str(page.relative_to(REPO)))
            if not args.check:
                page.write_text(new)
    if args.check and stale:
        print(f"docs_tables: out of date in {', '.join(stale)}; fix: .venv/bin/python bench/docs_tables.py")
        return 1
    print(f"docs_tables: {'rewrote ' + ', '.join(stale) if stale else 'every table is current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
