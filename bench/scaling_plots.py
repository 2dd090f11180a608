"""The scaling lab's plots: speedup per model size, loss per option, speed vs validation loss."""

from __future__ import annotations

from pathlib import Path


def plots(rep: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one panel per model size: measured points only, median with min-max bars, and the ideal line
    items = list(rep["sizes"].items())
    fig, axes = plt.subplots(1, max(1, len(items)), figsize=(5 * max(1, len(items)), 4.2), squeeze=False)
    for ax, (size, e) in zip(axes[0], items, strict=False):
        rows = [r for r in e["rows"] if r["speedup"] is not None]
        nmax = max([2] + [r["ranks"] for r in rows])
        ax.plot([1, nmax], [1, nmax], "k--", lw=1, label="ideal")
        # every other way of synchronizing measured on N nodes gets its own marker
        others = sorted({r["comm"] for r in rows if r["nodes"] > 1 and r["comm"] not in ("fp32", "auto")
                         and not r["comm"].startswith("local")})
        series = [("o-", lambda r: r["ranks_per_node"] == 1 and r["comm"] == "fp32", "nodes x 1 rank, fp32"),
                  ("*", lambda r: r["nodes"] > 1 and r["comm"] == "auto", "auto"),
                  ("D", lambda r: r["nodes"] > 1 and r["comm"].startswith("local"),
                   "local SGD (sync every H)"),
                  ("s", lambda r: r["nodes"] == 1 and r["ranks_per_node"] > 1, "1 node x 2 ranks (loopback)")]
        series += [(m, lambda r, c=c: r["nodes"] > 1 and r["comm"] == c, f"nodes x 1 rank, {c}")
                   for m, c in zip("^vP<>", others, strict=False)]
        for marker, pick, name in series:
            pts = sorted((r["ranks"], r["speedup"], r["speedup_min"], r["speedup_max"], r["comm_chosen"])
                         for r in rows if pick(r))
            if not pts:
                continue
            x, y, lo, hi, chosen = zip(*pts, strict=True)
            label = name if name != "auto" else f"auto ({', '.join(sorted(set(chosen)))})"
            ax.errorbar(x, y, yerr=[[a - b for a, b in zip(y, lo, strict=True)],
                                    [b - a for a, b in zip(y, hi, strict=True)]],
                        fmt=marker, ms=9 if marker == "*" else 6, capsize=4, label=label)
        params = f", {e['params'] / 1e6:.1f}M params" if e.get("params") else ""
        ax.set_title(f"{size}{params} ({e['rounds']} rounds)", fontsize=9)
        ax.set_xlabel("ranks (nodes x ranks per node)")
        ax.set_ylabel("speedup in tokens/s vs 1 node (median, min-max)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.suptitle(f"ddplab scaling at {rep['rate'] or 'unshaped'}", fontsize=10)
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

    # what a way of synchronizing buys in speed and costs in validation loss at equal tokens
    sizes = [(s, e) for s, e in rep["sizes"].items() if any(e.get("val_vs_fp32", {}).values())]
    if sizes:
        fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.4), squeeze=False)
        for ax, (size, e) in zip(axes[0], sizes, strict=True):
            rows = {r["label"]: r for r in e["rows"]}
            ref = rows[e["val_reference"]]
            pts = [(ref, 0.0, 0.0, 0.0)] + [(rows[lb], *(100 * (v[k] - 1) for k in ("median", "min", "max")))
                                             for lb, v in e["val_vs_fp32"].items() if v]
            for i, (r, y, lo, hi) in enumerate(sorted(pts, key=lambda p: p[1])):
                if r["speedup"] is None:
                    continue
                ax.errorbar([r["speedup"]], [y], xerr=[[r["speedup"] - r["speedup_min"]],
                                                       [r["speedup_max"] - r["speedup"]]],
                            yerr=[[y - lo], [hi - y]], fmt="s" if r is ref else "o", capsize=3)
                ax.annotate(r["label"], (r["speedup"], y), textcoords="offset points",  # alternate: labels
                            xytext=(5, 4 if i % 2 else -11), fontsize=7)           # of equal losses apart
            ax.axhline(0, color="k", lw=0.8)
            ax.axvline(1, color="grey", lw=0.8, ls=":")
            ax.set_title(f"{size}: speed vs loss, reference {e['val_reference']} ({e['rounds']} rounds)",
                         fontsize=9)
            ax.set_xlabel("tokens/s vs 1 node (median, min-max)")
            ax.set_ylabel("validation loss vs the reference at equal tokens (%)")
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "tradeoff.png", dpi=110)
        plt.close(fig)
