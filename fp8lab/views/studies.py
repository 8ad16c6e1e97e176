"""Figures of the studies: long context and FP8 attention (``long_context_figure``), throughput against
instances (``instances_figure``), loss parity against BF16's seeds (``parity_figure``), FP8 health per layer
(``fp8_health_figure``), why faster than the source blog (``blog_gap_figure``). Re-exported by
:mod:`fp8lab.views.plots`, where every figure is found."""
from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fp8lab.analysis import group_key, is_fp8, reference_for
from fp8lab.analysis.parity import MIN_BAND_PCT
from fp8lab.core.hardware import gpu_label
from fp8lab.views.figure import _empty, _finish, _grid, _models, _new, _shared_legend


LONG_CONTEXT_ROLES = {"fp8": ("FP8 GEMMs, BF16 attention", ""), "fp8_attn": ("FP8 GEMMs + FP8 attention", "//")}


def long_context_figure(table: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """FP8/BF16 tokens/s against the sequence length, FP8 attention off and on: two bars per length, one
    panel per model, from ``fp8lab.analysis.long_context.speedup_table`` (the long-context study's committed result
    files)."""
    title = "FP8 speed-up over BF16 against the sequence length"
    if not len(table):
        return _finish(_empty(title, "no long-context study committed yet\n(data/results/long-context-h200/: "
                                     "benchmarks/study_long_context.sh)"), save)
    models = list(dict.fromkeys(table["model"].fillna("?")))
    fig, axes = _new(ncols=len(models), width=6.0 if len(models) == 1 else 4.6, height=4.0)
    top = float(table["speedup"].max()) * 1.3  # room for the legend above the bars
    for mi, model in enumerate(models):
        mine = table[table["model"].fillna("?") == model]
        seqs = sorted(mine["seq_len"].unique())
        ax = axes[0, mi]
        width = 0.38
        for i, (role, (label, hatch)) in enumerate(LONG_CONTEXT_ROLES.items()):
            g = mine[mine["role"] == role].set_index("seq_len").reindex(seqs)
            xs = np.arange(len(seqs)) + (i - 0.5) * width
            color = matplotlib.colormaps["Oranges"](0.5 + 0.3 * i)
            bars = ax.bar(xs, g["speedup"], width, label=label, color=color, hatch=hatch, edgecolor="0.3")
            ax.bar_label(bars, labels=["" if np.isnan(v) else f"{v:.2f}x" for v in g["speedup"]], fontsize=8, padding=2)
        ax.axhline(1.0, ls="--", color="0.4", lw=1)
        ax.set_xticks(range(len(seqs)), [f"{s // 1024}K" if s % 1024 == 0 else str(s) for s in seqs])
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylim(0, top)
        gpus = ", ".join(mine["gpu_name"].dropna().unique())
        accum = sorted({int(a) for a in mine.get("grad_accum", pd.Series(dtype=float)).dropna()})
        accum = f", accumulation {'/'.join(map(str, accum))}" if accum else ""
        ax.set_title(f"{model} on {gpus}{accum}", fontsize=10)
        if mi == 0:
            ax.set_ylabel("tokens/s relative to BF16 at that length")
            ax.legend(loc="upper left", fontsize=8)
    if len(models) == 1:
        axes[0, 0].set_title(f"{title}\n{axes[0, 0].get_title()}", fontsize=10)
    else:
        fig.suptitle(title, fontsize=11)
    return _finish(fig, save)


# past one node: P5 instances and the scaling model (fp8lab.analysis.scaling) --------------------
_SCALING_STYLE = {"bf16": ("tab:blue", "-", "o"), "fp8": ("tab:orange", "-", "s"),
                  "fp8 + fp8 all-gather": ("tab:red", "--", "^")}


def _coincide(a: pd.Series, b: pd.Series, rel: float = 0.005) -> bool:
    """Two series (indexed alike) within ``rel`` of each other everywhere: drawn apart, one would hide the other."""
    a, b = a.align(b, join="inner")
    return bool(len(a)) and bool(((a - b).abs() <= rel * b.abs()).all())


_MODEL_STYLE = [("-", "o"), ("--", "s"), ("-.", "D"), (":", "v")]  # a model's line style and marker, per model


def instances_figure(table: pd.DataFrame, reference: pd.DataFrame | None = None,
                   save: str | Path | None = None) -> Figure:
    """Tokens/s/GPU against P5 instances (the source's chart), per model BF16, FP8 and FP8 with FP8
    all-gather as the scaling model projects them from measured runs (``fp8lab.analysis.scaling.instance_table``,
    several models concatenated), and FP8's gain; the source's reported speedups marked as reported (it states no
    instance count, so they are a level, not points). A precision's colour, a model's line style and marker;
    FP8 all-gather is drawn only where it differs from plain FP8 by more than 0.5% (else FP8's label says so)."""
    title = ("Past one node, projected (fp8lab.analysis.scaling) from measured runs: tokens/s per GPU on P5; not "
             "measured past 2 GPUs")
    if not len(table):
        return _finish(_empty(title, "nothing projected"), save)
    fig, axes = _new(ncols=2, width=6.0, height=4.2)
    rate_ax, gain_ax = axes[0, 0], axes[0, 1]
    for mi, model in enumerate(_models(table)):
        mine = table[table["model"] == model]
        style, marker = _MODEL_STYLE[mi % len(_MODEL_STYLE)]
        by_mode = {mode: g.sort_values("instances").set_index("instances")
                   for mode, g in mine.groupby("mode", sort=False)}
        same = "fp8" in by_mode and "fp8 + fp8 all-gather" in by_mode and \
            _coincide(by_mode["fp8 + fp8 all-gather"]["tokens_per_sec_per_gpu"],
                      by_mode["fp8"]["tokens_per_sec_per_gpu"])
        for mode, g in by_mode.items():
            if same and mode == "fp8 + fp8 all-gather":
                continue
            color = _SCALING_STYLE.get(mode, ("0.4", ":", "x"))[0]
            name = mode.upper().replace("ALL-GATHER", "all-gather")
            label = f"{model} {name}" + (" (FP8 all-gather the same)" if same and mode == "fp8" else "")
            kw = dict(ls=style, marker=marker, color=color, ms=4, mfc="none" if mi else color)
            rate_ax.plot(g.index, g["tokens_per_sec_per_gpu"], label=label, **kw)
            if mode != "bf16":
                gain_ax.plot(g.index, g["fp8_gain"], label=label, **kw)
        rep = reference_for(reference, model)
        for _, r in rep.iterrows():
            gain_ax.axhline(r["speedup"], color="0.3", lw=1, ls=(0, (2, 2)))
            gain_ax.annotate(f"source, {r['model_size']}: {r['speedup']:.2f}x (reported; instances not stated)",
                             (0.02, r["speedup"]), xycoords=("axes fraction", "data"), fontsize=8, va="bottom",
                             color="0.3")
    counts = sorted(table["instances"].unique())
    for ax, ylabel in ((rate_ax, "tokens/s per GPU (projected)"), (gain_ax, "FP8 / BF16 tokens/s (projected)")):
        ax.set_xlabel(f"{table['gpus'].iloc[0] // table['instances'].iloc[0]}-GPU instances")
        ax.set_ylabel(ylabel)
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(c) for c in counts])
        ax.grid(alpha=0.3)
    rate_ax.set_yscale("log")  # models an order of magnitude apart, each line readable
    rate_ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # a label per line
    rate_ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    rate_ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    rate_ax.set_title("per-GPU rate", fontsize=10)
    gain_ax.set_title("FP8's gain over BF16", fontsize=10)
    _shared_legend(fig, axes)
    fig.suptitle(title, fontsize=10)
    return _finish(fig, save)


# loss parity against the BF16 seeds (fp8lab.analysis.parity) ------------------------------------------
def parity_figure(curves: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Validation loss of a loss study with several BF16 seeds (``analysis.parity_curves``), and below it each run's
    gap to the BF16 seeds' mean in percent, inside the grey band it is read against. One study: the
    first (model, study) of ``curves``; runs with the FP8 LM head (a study option) are left out."""
    title = "Validation loss against BF16's seed-to-seed noise"
    if not len(curves):
        return _finish(_empty(title, "no loss study with two or more BF16 seeds\n(benchmarks/study_loss_parity.sh)"),
                       save)
    model, study = curves.iloc[0][["model", "study"]]
    g = curves[(curves["model"] == model) & (curves["study"].map(group_key) == group_key(study))]
    # the recipes as they run by default: a study option's runs (the FP8 LM head, labelled "fp8-head") have their
    # own page (benchmarks/studies/fp8_lm_head.md) and would double the legend with look-alike labels
    g = g[~g["variant"].astype(str).str.contains("fp8-head", regex=False)]
    fig, axes = _new(nrows=2, width=6.5, height=3.2, sharex=True)
    top, bottom = axes[0, 0], axes[1, 0]
    oranges = matplotlib.colormaps["Oranges"]
    runs = g.drop_duplicates("run_id")
    # the BF16 seeds as one band (their range) around their mean, so that the FP8 runs stay readable lines
    bf16 = g[~g["precision"].map(is_fp8)].pivot_table(index="step", columns="run_id", values="val_loss", aggfunc="last")
    at = g.drop_duplicates("step").set_index("step").loc[bf16.index, "tokens"] / 1e6
    top.fill_between(at, bf16.min(axis=1), bf16.max(axis=1), color=_SCALING_STYLE["bf16"][0], alpha=0.25, lw=0,
                     label=f"BF16: range of {bf16.shape[1]} seeds")
    top.plot(at, bf16.mean(axis=1), "--", color=_SCALING_STYLE["bf16"][0], lw=1.6, label="BF16: their mean")
    fp8 = runs[runs["precision"].map(is_fp8)]
    for i, (_, r) in enumerate(fp8.iterrows()):
        c = g[g["run_id"] == r["run_id"]].sort_values("step")
        x = c["tokens"] / 1e6
        color = oranges(0.5 + 0.4 * i / max(len(fp8) - 1, 1))
        recipe = f" {r['recipe']}" if isinstance(r["recipe"], str) else ""
        label = f"FP8{recipe}" + (f" (seed {int(r['seed'])})" if pd.notna(r["seed"]) else "")
        # a recipe a style
        style = "-" if r["recipe"] in (None, "delayed") or not isinstance(r["recipe"], str) else "-."
        top.plot(x, c["val_loss"], style, color=color, label=label, lw=1.6)
        bottom.plot(x, c["gap_pct"], style, color=color, lw=1.6)
    band = g.drop_duplicates("step").sort_values("step")
    bx = band["tokens"] / 1e6
    bottom.fill_between(bx, -band["band_pct"], band["band_pct"], color="0.85",
                        label=f"band: max({MIN_BAND_PCT:g}%, BF16 seeds' spread)")
    bottom.axhline(0, color="0.4", lw=0.8)
    top.set_ylabel("validation loss")
    where = f", study {study}" if isinstance(study, str) else ""
    top.set_title(f"{model}{where}: {int(band['bf16_seeds'].iloc[0])} BF16 seeds")
    top.legend(fontsize=8)
    bottom.set_ylabel("% against the BF16 mean")
    bottom.set_xlabel("training tokens (millions)")
    bottom.legend(fontsize=8, loc="lower left")
    b_end = band["band_pct"].iloc[-1]  # the end's band, three times over, and every run's whole curve in view
    bottom.set_ylim(min(-3 * b_end, g["gap_pct"].min() - 0.5), max(3 * b_end, g["gap_pct"].max()) + 0.5)
    fig.suptitle(title)
    return _finish(fig, save)


# FP8 health (recorded by fp8lab.fp8.stats, read by fp8lab.analysis.fp8_stats)
HEALTH_METRICS = {"underflow": "values flushed to 0", "saturation": "values clipped at the format's max"}
HEALTH_FLOOR = 1e-6  # the colour scale's bottom: fractions below it (0 included) share its colour


def fp8_health_figure(table: pd.DataFrame, metric: str = "underflow", title: str = "",
                      save: str | Path | None = None) -> Figure:
    """A layer-by-step heatmap per tensor kind (activation, weight, gradient) of ``metric`` (underflow or
    saturation; ``"both"``: a row of each, one figure) from :func:`fp8lab.analysis.fp8_stats.table`: a row per decoder
    block (the worst of its GEMMs), a column per sampled step, log colour scale from 1e-6 to 1."""
    from matplotlib.colors import LogNorm

    if metric not in (*HEALTH_METRICS, "both"):
        raise ValueError(f"metric must be one of {', '.join(HEALTH_METRICS)} or both, got {metric!r}")
    metrics = list(HEALTH_METRICS) if metric == "both" else [metric]
    head = ("FP8 underflow and saturation" if metric == "both" else
            f"FP8 {metric}: fraction of {HEALTH_METRICS[metric]}") + (f" - {title}" if title else "")
    t = table.dropna(subset=metrics, how="all") if len(table) else table
    if not len(t):
        return _empty(head, "no FP8 statistics recorded (FP8 runs with --fp8-stats-every > 0)")
    kinds = [k for k in ("activation", "weight", "gradient") if k in set(t["kind"])]
    # both metrics: a row each (kinds across); one metric: the usual grid
    if len(metrics) > 1:  # a row per metric on a fixed grid: the labels are known (blocks left, steps below), and a
        # layout engine's search would be most of the drawing time
        fig = Figure(figsize=(5.2 * len(kinds), 3.6 * len(metrics)))
        axes = list(fig.subplots(len(metrics), len(kinds), squeeze=False, gridspec_kw=dict(
            left=0.05, right=0.87, bottom=0.08, top=0.9, wspace=0.06, hspace=0.2)).flat)
    else:
        fig, axes = _grid(len(kinds), width=5.2, height=3.6)
    norm = LogNorm(vmin=HEALTH_FLOOR, vmax=1.0)
    image = None
    for ax, (m, kind) in zip(axes, [(m, k) for m in metrics for k in kinds]):
        grid = t[t["kind"] == kind].pivot_table(index="block", columns="step", values=m, aggfunc="max")
        image = ax.imshow(grid.clip(lower=HEALTH_FLOOR).to_numpy(dtype=float), aspect="auto", norm=norm,
                          cmap="magma_r", interpolation="nearest")
        ax.set_title(f"{m}: {kind}" if len(metrics) > 1 else kind)
        # both metrics: block labels on the first column, steps on the bottom row only
        first_col, bottom_row = (kind == kinds[0], m == metrics[-1]) if len(metrics) > 1 else (True, True)
        ax.set_yticks(range(len(grid.index)), [b.replace("block ", "") for b in grid.index] if first_col else [],
                      fontsize=7)
        steps = list(grid.columns)
        ticks = sorted(set(np.linspace(0, len(steps) - 1, min(6, len(steps))).round().astype(int)))
        ax.set_xticks(ticks, [str(steps[i]) for i in ticks] if bottom_row else [], fontsize=8)
        if bottom_row:
            ax.set_xlabel("step")
        if first_col:
            ax.set_ylabel("decoder block")
    if len(metrics) > 1:
        fig.colorbar(image, cax=fig.add_axes((0.885, 0.15, 0.012, 0.7)), label="fraction of values")
    else:
        fig.colorbar(image, ax=axes, shrink=0.8, label=f"fraction ({metric})")
    fig.suptitle(head)
    return _finish(fig, save)


# why fp8lab's speed-up exceeds the source blog's (fp8lab.analysis.blog_gap) --------------------------------------
def blog_gap_figure(table: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """FP8/BF16 tokens/s of one model at the layouts that separate fp8lab's headline from the blog's
    (:func:`fp8lab.analysis.blog_gap.blog_gap_table`), one bar per step, with the blog's reported speed-up
    as a dashed level (reported, not measured here)."""
    title = "Why faster than the blog: the same model, one change at a time (measured, one GPU)"
    if not len(table):
        return _finish(_empty(title, "the study's result files are not in these runs"), save)
    fig, axes = _new(ncols=1, width=7.5, height=3.6)
    ax = axes[0, 0]
    y = list(range(len(table)))
    ax.barh(y, table["speedup"], color="#d9822b")
    for i, v in zip(y, table["speedup"]):
        ax.annotate(f"{v:.2f}x", (v, i), xytext=(3, 0), textcoords="offset points", va="center", fontsize=9)
    ax.set_yticks(y, list(table["step"]))
    ax.invert_yaxis()
    ax.axvline(1.0, color="0.3", lw=0.8)
    blog = table["source_speedup"].dropna()
    if len(blog):
        level = float(blog.iloc[0])
        ax.axvline(level, color="0.3", lw=1.2, ls=(0, (3, 2)))
        ax.set_ylim(len(table) - 0.5, -1.3)  # a row of room above the bars for the level's label
        ax.annotate(f"the blog's {level:.2f}x (reported on P5, not measured here)", (level, -0.9), xytext=(-4, 0),
                    textcoords="offset points", va="center", ha="right", fontsize=8, color="0.3")
    ax.set_xlim(0, 1.15 * float(table["speedup"].max()))
    ax.set_xlabel(f"FP8 / BF16 tokens/s/GPU ({table['model'].iloc[0]}, {gpu_label(table['gpu_name'].iloc[0])})")
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=10)
    return _finish(fig, save)
