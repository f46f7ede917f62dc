"""PNG plots for `bench offline` (matplotlib, headless)."""
from __future__ import annotations

from pathlib import Path

from ..proposers.registry import METHOD_TABLE
from ..utils import atomic_path
from .summary import ALL


def _legend(ax, **kw) -> None:
    if ax.get_legend_handles_labels()[0]:      # nothing plotted (e.g. no draft positions): no empty legend
        ax.legend(**kw)


def _save(fig, path: Path) -> str:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    return path.name


def write_plots(result: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = [r for r in result["summary"] if r.get("decode_tok_s") is not None]
    if not summary:
        return []
    temps = sorted({r["temperature"] for r in summary})
    t0 = temps[0]
    cats = list(dict.fromkeys(r["category"] for r in summary if r["category"] != ALL))
    methods = list(dict.fromkeys(r["method"] for r in summary))
    spec = [m for m in methods if m in METHOD_TABLE and METHOD_TABLE[m].kind != "plain"]
    files = []

    # 1. decode tok/s by method and category (each method at its fastest k)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(cats) + 2), 4))
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        vals = []
        for c in cats:
            rows = [r for r in summary if r["method"] == m and r["category"] == c and r["temperature"] == t0]
            vals.append(max((r["decode_tok_s"] for r in rows), default=0))
        ax.bar([i + j * width for i in range(len(cats))], vals, width, label=m)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(cats))], cats)
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"Decode speed by method and category (temperature {t0:g}, best k)")
    _legend(ax, fontsize=8)
    files.append(_save(fig, out / "decode_tok_s.png"))
    plt.close(fig)

    # 2. acceptance and speedup vs k
    if spec:
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
        for m in spec:
            for c in cats + ([ALL] if len(cats) > 1 else []):
                rows = sorted((r for r in summary
                               if r["method"] == m and r["category"] == c and r["temperature"] == t0),
                              key=lambda r: r["k"])
                if not rows:
                    continue
                style = "-" if c == ALL else ":"
                ks = [r["k"] for r in rows]
                a1.plot(ks, [r["acceptance_rate"] or 0 for r in rows], style, marker="o", label=f"{m} {c}")
                a2.plot(ks, [r["speedup"] or 0 for r in rows], style, marker="o", label=f"{m} {c}")
        a1.set_xlabel("k")
        a1.set_ylabel("acceptance rate")
        a2.set_xlabel("k")
        a2.set_ylabel("speedup vs none")
        a2.axhline(1.0, color="grey", lw=0.8)
        a1.set_title(f"Acceptance vs k (T={t0:g})")
        a2.set_title(f"Speedup vs k (T={t0:g})")
        _legend(a2, fontsize=7, ncol=2)
        files.append(_save(fig, out / "acceptance_speedup_vs_k.png"))
        plt.close(fig)

        # 3. speedup vs temperature (category 'all' or the only one; each method at each k)
        cat = ALL if len(cats) > 1 else cats[0]
        fig, ax = plt.subplots(figsize=(6, 4))
        for m in spec:
            for k in sorted({r["k"] for r in summary if r["method"] == m}):
                rows = sorted((r for r in summary if r["method"] == m and r["k"] == k and r["category"] == cat),
                              key=lambda r: r["temperature"])
                ax.plot([r["temperature"] for r in rows], [r["speedup"] or 0 for r in rows], marker="o",
                        label=f"{m} k={k}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel("temperature")
        ax.set_ylabel("speedup vs none")
        ax.set_title(f"Speedup vs temperature ({cat})")
        _legend(ax, fontsize=7)
        files.append(_save(fig, out / "speedup_vs_temperature.png"))
        plt.close(fig)

        # 4. per-position acceptance
        fig, ax = plt.subplots(figsize=(6, 4))
        for r in summary:
            if r["method"] in spec and r["category"] == cat and r["temperature"] == t0 and r["accepted_per_position"]:
                pos = r["accepted_per_position"]
                ax.plot(range(1, len(pos) + 1), pos, marker="o", label=f"{r['method']} k={r['k']}")
        ax.set_xlabel("draft position")
        ax.set_ylabel("acceptance at position")
        ax.set_ylim(0, 1.05)
        ax.set_title(f"Per-position acceptance ({cat}, T={t0:g})")
        _legend(ax, fontsize=7)
        files.append(_save(fig, out / "acceptance_per_position.png"))
        plt.close(fig)
    return files
