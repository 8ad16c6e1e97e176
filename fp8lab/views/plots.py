"""Figures for BF16 vs FP8 runs: throughput, speedup, loss, MFU, cost and scaling.

Each function takes the tables of :mod:`fp8lab.analysis` and returns a matplotlib ``Figure``
(saved as PNG and SVG when ``save`` names a path stem). With no measured data a figure still
renders and says so, so notebooks and reports work before any GPU result exists.
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.container
import matplotlib.ticker
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from fp8lab.analysis.labels import FP8_HEAD, fine_tune_rows
from fp8lab.analysis.peers import peer_rows
from fp8lab.plan.memory_modes import PLAIN
from fp8lab.analysis import (group_key, is_false, is_fp8, model_size_b, reference_for, scaling_axis, smooth,
                             variant_kind)
from fp8lab.analysis.summary import same_seed
from fp8lab.fp8.recipe import TABLE as RECIPE_TABLE
from fp8lab.views.figure import (MAX_BARS, MAX_COLS, MAX_COLS_SMALL, MAX_HEADLINE_PANELS,  # noqa: F401
                                 MAX_LEGEND_KINDS, NO_DATA, _HATCHES, _empty, _finish, _grid, _models, _new,
                                 _shared_legend, _tick_name, figure_name, figure_stats, save_figure, show, to_png)
from fp8lab.views.studies import (HEALTH_FLOOR, HEALTH_METRICS, LONG_CONTEXT_ROLES,  # noqa: F401 (every figure
                                  blog_gap_figure, fp8_health_figure, instances_figure, long_context_figure,
                                  parity_figure)  # is found here)

REFERENCE_LABEL = "source blog (H100, P5): reported, not measured here"


def _variant_colors(variants: list[str], precisions: dict[str, str]) -> dict[str, tuple]:
    """BF16 variants in blues, FP8 in oranges, so the two precisions read apart at a glance."""
    bf = [v for v in variants if not is_fp8(precisions.get(v))]
    f8 = [v for v in variants if is_fp8(precisions.get(v))]
    colors = {}
    for group, cmap in ((bf, matplotlib.colormaps["Blues"]), (f8, matplotlib.colormaps["Oranges"])):
        for i, v in enumerate(group):
            colors[v] = cmap(0.75 - 0.45 * i / max(len(group) - 1, 1)) if len(group) > 1 else cmap(0.7)
    return colors


def _kind_labels(frame: pd.DataFrame) -> dict[str, str]:
    """The kind of each run, as a legend names it: its variant, with its study where runs of several studies
    share a panel (runs alike, e.g. a study's seeds, share a kind)."""
    meta = frame.drop_duplicates("run_id").set_index("run_id")
    studies = meta["study"] if "study" in meta else pd.Series(index=meta.index, dtype=object)
    several = studies.dropna().nunique() > 1
    return {rid: f"{m['variant']} ({studies[rid]})" if several and isinstance(studies[rid], str) else str(m["variant"])
            for rid, m in meta.iterrows()}


def _run_labels(frame: pd.DataFrame) -> dict[str, str]:
    """A short legend label per run: its kind (:func:`_kind_labels`), and its run id only where that still
    leaves two runs alike."""
    label = _kind_labels(frame)
    counts = pd.Series(list(label.values())).value_counts()
    return {rid: f"{lab} [{rid}]" if counts[lab] > 1 else lab for rid, lab in label.items()}


def _kind_entries(frame: pd.DataFrame, kind: dict[str, str]) -> dict[str, str]:
    """Kind -> its legend entry: the kind, and how many seeds (or runs) it holds where it holds several."""
    seeds = dict(frame.drop_duplicates("run_id")[["run_id", "seed"]].values) if "seed" in frame else {}
    entry = {}
    for name in dict.fromkeys(kind.values()):
        members = [rid for rid, k in kind.items() if k == name]
        known = {seeds.get(rid) for rid in members if pd.notna(seeds.get(rid))}
        entry[name] = name if len(members) == 1 else \
            f"{name} ({len(members)} {'seeds' if len(known) == len(members) else 'runs'})"
    return entry


def _ordered_variants(frame: pd.DataFrame) -> list[str]:
    v = frame[["variant", "precision"]].drop_duplicates("variant")
    return sorted(v["variant"], key=lambda x: (is_fp8(dict(v.values).get(x)), x))


def _scale_axis(summary: pd.DataFrame, by: str) -> str:
    if by == "auto":
        return "instances" if summary["instances"].nunique(dropna=True) > 1 else "world_size"
    if by not in ("instances", "world_size"):
        raise ValueError(f"by={by!r}; allowed: 'auto', 'instances', 'world_size'")
    return by


_SCALE_LABEL = {"instances": "instances", "world_size": "GPUs"}


def throughput_figure(summary: pd.DataFrame, by: str = "auto", save: str | Path | None = None) -> Figure:
    """Tokens/s/GPU against instance (or GPU) count, one bar per kind of run (precision, backend, FP8
    recipe: :func:`fp8lab.analysis.variant_kind`) side by side, per model; each bar the fastest run of
    its kind at that scale (the runs table names them all).

    Bar height is the steady-state median; the whisker spans the quartiles where known.
    """
    title = "Throughput per GPU (steady state): the fastest run of each kind"
    s = summary[summary["tokens_per_sec_per_gpu"].notna()] if len(summary) else summary
    # a peer's runs have their own table (fp8lab.analysis.peers); a fine-tune's step is another workload
    s = s[~peer_rows(s) & ~fine_tune_rows(s)] if len(s) else s
    if not len(s):
        return _finish(_empty(title), save)
    by = _scale_axis(s, by)
    s = s.assign(variant=s["variant"].map(variant_kind), _scale=s[by].fillna(1))
    s = s.loc[s.groupby(["model", "variant", "_scale"])["tokens_per_sec_per_gpu"].idxmax()]
    models = _models(s)
    small = len(models) > 2 * MAX_COLS
    fig, axes = _grid(len(models), width=4.2 if small else 5.0, height=2.8 if small else 3.8,
                      max_cols=MAX_COLS_SMALL if small else MAX_COLS)
    colors = _variant_colors(_ordered_variants(s), dict(s[["variant", "precision"]].values))
    for ax, model in zip(axes, models):
        g = s[s["model"] == model]
        scales = sorted(g["_scale"].unique())
        variants = _ordered_variants(g)
        width = 0.8 / len(variants)
        for i, var in enumerate(variants):
            gv = g[g["variant"] == var].set_index("_scale").reindex(scales)
            x = np.arange(len(scales)) + (i - (len(variants) - 1) / 2) * width
            err = None
            if gv["tps_p25"].notna().any():
                err = np.vstack([(gv["tokens_per_sec_per_gpu"] - gv["tps_p25"]).clip(lower=0).fillna(0),
                                 (gv["tps_p75"] - gv["tokens_per_sec_per_gpu"]).clip(lower=0).fillna(0)])
            ax.bar(x, gv["tokens_per_sec_per_gpu"].fillna(0), width, yerr=err, capsize=3,
                   label=var, color=colors[var])
        ax.set_xticks(np.arange(len(scales)), [f"{v:g}" for v in scales])
        ax.set_xlabel(_SCALE_LABEL[by])
        ax.set_ylabel("tokens/s/GPU")
        ax.set_title(str(model), fontsize=10 if small else None)
    _shared_legend(fig, np.array(axes))
    fig.suptitle(title)
    return _finish(fig, save)


def speedup_figure(comparison: pd.DataFrame, reference: pd.DataFrame | None = None,
                   save: str | Path | None = None) -> Figure:
    """FP8 speedup over BF16 per model size (smallest measured scale), one bar per kind of FP8 run
    (backend and recipe; the best pair of that kind), with the source's reported values as labelled
    reference markers. The axis starts at 0: a ratio's bar is read against 1.0. Where one bar per model and
    kind would pass ``MAX_BARS``, each model shows its best kind's bar (its colour names the kind). Pretraining
    only: a fine-tune's step is another workload (its own table in the report)."""
    title = "FP8 speedup over BF16 (tokens/s/GPU), the best pair of each kind"
    comp = comparison[comparison["speedup"].notna() & ~fine_tune_rows(comparison)] if len(comparison) else comparison
    has_ref = reference is not None and len(reference)
    if not len(comp) and not has_ref:
        return _finish(_empty(title), save)
    if len(comp):
        comp = comp.assign(fp8_variant=comp["fp8_variant"].map(variant_kind))
        comp = comp[comp["world_size"].fillna(1) == comp.groupby("model")["world_size"].transform(
            lambda w: w.fillna(1).min()).fillna(1)]
        comp = comp.loc[comp.groupby(["model", "fp8_variant"])["speedup"].idxmax()]
        if len(comp) > MAX_BARS:
            comp = comp.loc[comp.groupby("model")["speedup"].idxmax()]
            title = "FP8 speedup over BF16 (tokens/s/GPU), each model's best FP8 pair"
    categories = _models(comp) if len(comp) else []
    fig, axes = _new(width=max(8.0, 1.0 * len(categories) + 1.5), height=4.2)
    ax = axes[0, 0]
    ref_pos = {}
    if has_ref:
        for _, r in reference.iterrows():
            match = [m for m in categories if np.isclose(model_size_b(m), r["params_b"])]
            if match:
                ref_pos[r["model_size"]] = categories.index(match[0])
            else:
                categories.append(f"{r['model_size']} (source)")
                ref_pos[r["model_size"]] = len(categories) - 1
    if len(comp):
        variants = sorted(comp["fp8_variant"].unique())
        colors = _variant_colors(variants, {v: "fp8" for v in variants})
        per_model = int(comp.groupby("model").size().max())  # bars side by side per model
        width = 0.8 / per_model
        slot = {m: 0 for m in categories}
        for i, var in enumerate(variants):
            xs, ys = [], []
            for m in _models(comp):
                g = comp[(comp["model"] == m) & (comp["fp8_variant"] == var)]
                if len(g):
                    n = int((comp["model"] == m).sum())
                    xs.append(categories.index(m) + (slot[m] - (n - 1) / 2) * width)
                    ys.append(g["speedup"].max())
                    slot[m] += 1
            ax.bar(xs, ys, width, label=f"measured: {var}", color=colors[var], hatch=_HATCHES[i % len(_HATCHES)],
                   edgecolor="white")
            for x, y in zip(xs, ys):
                ax.annotate(f"{y:.2f}x", (x, y), xytext=(0, 2), textcoords="offset points", ha="center",
                            va="bottom", fontsize=7)
    else:
        ax.text(0.5, 0.92, NO_DATA, ha="center", transform=ax.transAxes, color="0.4")
    if has_ref:
        xs = [ref_pos[r["model_size"]] for _, r in reference.iterrows()]
        ax.scatter(xs, reference["speedup"], marker="D", s=50, color="crimson", zorder=5, label=REFERENCE_LABEL)
        ax.hlines(reference["speedup"], np.array(xs) - 0.45, np.array(xs) + 0.45, colors="crimson",
                  linestyles=":", lw=1.5, zorder=4)
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--", zorder=1)
    ax.set_xticks(range(len(categories)), categories)
    ax.set_xticklabels([_tick_name(c) for c in categories], fontsize=8)
    ax.set_xlim(-0.6, len(categories) - 0.4)
    ax.set_ylabel("speedup (FP8 / BF16)")
    values = [1.0, *(comp["speedup"] if len(comp) else []), *(reference["speedup"] if has_ref else [])]
    ax.set_ylim(0, 1.15 * max(values))
    ax.set_title(title)
    _shared_legend(fig, axes)
    return _finish(fig, save)


def loss_figure(runs: pd.DataFrame, smoothing: str = "ema", smoothing_span: int = 20,
                save: str | Path | None = None) -> Figure:
    """Training loss against tokens, BF16 vs FP8 (raw faint, smoothed solid), and below it the
    gap of each FP8 run's smoothed loss to the BF16 run of the same model, in percent (where a
    model has both; a model with one precision is one row, with a note saying what the gap needs). Pretraining runs
    only: a fine-tune's loss is another task's (notebook 06 compares it on held-out answers)."""
    title = f"Training loss ({smoothing}, span {smoothing_span}) and FP8 gap"
    steps = runs[(runs["record"] == "step") & runs["loss"].notna()] if len(runs) else runs
    steps = steps[~fine_tune_rows(steps)] if len(steps) else steps  # pretraining's (a fine-tune: notebook 06)
    if len(steps) and "loss_comparable" in steps:  # throughput runs: a few steps, not a loss comparison
        steps = steps[[not is_false(v) for v in steps["loss_comparable"]]]
    if not len(steps):
        return _finish(_empty(title, "no per-step loss to compare\n(throughput runs are too short)"), save)
    models = _models(steps)
    fp8_of = [is_fp8(p) for p in steps.drop_duplicates("run_id")["precision"]]
    paired = any(fp8_of) and not all(fp8_of)  # a gap needs a BF16 and an FP8 run: else one row, and say so
    if not paired:
        title = f"Training loss ({smoothing}, span {smoothing_span})"
    fig, axes = _new(ncols=len(models), nrows=2 if paired else 1, width=min(5.0, 13.0 / len(models)), height=3.2,
                     sharex="col")
    for col, model in enumerate(models):
        top = axes[0, col]
        g = steps[steps["model"] == model]
        panel_title = str(model)
        if len(set(_kind_labels(g).values())) > MAX_LEGEND_KINDS and "study" in g and g["study"].notna().any():
            # more kinds of run than a legend can name: the study that trained longest (the others: a studies filter)
            longest = g.groupby("study")["tokens"].max().idxmax()
            n_studies = g["study"].nunique()
            g = g[g["study"] == longest]
            panel_title = f"{model}: study {longest} (1 of {n_studies}; filter by study for the others)"
        x_col = "tokens" if g["tokens"].notna().all() else "step"
        label = _run_labels(g)
        # runs alike but for their seed (a loss study's seeds) share a colour and one legend entry, so that the
        # legend lists kinds of run, not every seed; notebook 05's parity figure tells the seeds apart
        group = _kind_labels(g)
        entry = _kind_entries(g, group)
        prec = {group[k]: p for k, p in g.drop_duplicates("run_id")[["run_id", "precision"]].values}
        by_group = _variant_colors(sorted(prec, key=lambda v: (is_fp8(prec[v]), v)), prec)
        colors = {label[k]: by_group[group[k]] for k in label}
        curves, shown = {}, set()
        for run_id, r in g.groupby("run_id", sort=True):
            r = r.sort_values("step")
            sm = smooth(r["loss"], smoothing, smoothing_span).to_numpy()
            x = r[x_col].to_numpy(dtype=float)
            c = colors[label[run_id]]
            top.plot(x, r["loss"], color=c, alpha=0.25, lw=0.8)
            base = not is_fp8(r["precision"].iloc[0])  # BF16 on top, dashed: the FP8 curves it tracks never hide it
            first = group[run_id] not in shown
            shown.add(group[run_id])
            top.plot(x, sm, color=c, lw=2.0 if base else 1.6, ls="--" if base else "-", zorder=4 if base else 3,
                     label=entry[group[run_id]] if first else "_nolegend_", gid=f"smoothed:{run_id}")
            curves[run_id] = (is_fp8(r["precision"].iloc[0]), x, sm)
        if x_col == "tokens":  # "20M", not "2.0" under a "1e7" offset
            for ax in axes[:, col]:
                ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
        top.set_title(panel_title, fontsize=10 if panel_title != str(model) else None)
        top.set_ylabel("loss")
        # losses fall from the top left, so the legend sits top right; long labels (recipe settings)
        # wrap, so it stays narrow there. The gap lines below share these colours
        handles, names = top.get_legend_handles_labels()
        top.legend(handles, [textwrap.fill(re.sub(r",(?!\s)", ", ", n), 30, break_long_words=False) for n in names],
                   fontsize=7,
                   loc="upper right")
        if not paired:
            top.set_xlabel(x_col)
            top.text(0.02, 0.03, "FP8 gap: needs a BF16 and an FP8 run", transform=top.transAxes, fontsize=8,
                     color="0.4")
            continue
        _gap_panel(axes[1, col], g, curves, colors, label, x_col, group)
    fig.suptitle(title)
    return _finish(fig, save)


def _gap_panel(bottom, g: pd.DataFrame, curves: dict, colors: dict, label: dict, x_col: str,
               kind: dict | None = None) -> None:
    """Each FP8 run's smoothed loss against the BF16 run of its study and seed (else of its study, else the first
    BF16 run), in percent. Runs of one ``kind`` (a study's seeds) share a colour and one label."""
    named: set[str] = set()
    study = dict(g[["run_id", "study"]].drop_duplicates("run_id").values) if "study" in g else {}
    meta = g.drop_duplicates("run_id").set_index("run_id", drop=False)
    base = [k for k, v in curves.items() if not v[0]]
    for run_id, (fp8, x, sm) in curves.items():
        if not fp8 or not base:
            continue
        # the BF16 run of the same study (same data, order and hyperparameters) and seed (analysis' pairing rule:
        # the same initial weights and data order, where the study has several seeds), else of the same study,
        # else the first BF16 run
        same_study = [k for k in base if study.get(k) == study.get(run_id)]
        twin = list(same_seed(meta.loc[same_study], meta["seed"].get(run_id) if "seed" in meta else None)["run_id"])
        base_id = (twin or same_study or base)[0]
        _, bx, bsm = curves[base_id]
        inside = (x >= bx.min()) & (x <= bx.max())
        gap = 100 * (sm[inside] - np.interp(x[inside], bx, bsm)) / np.interp(x[inside], bx, bsm)
        k = (kind or label)[run_id]
        bottom.plot(x[inside], gap, color=colors[label[run_id]], gid=f"gap:{run_id}",
                    label="_nolegend_" if k in named else f"{k} vs its BF16 twin")
        named.add(k)
    bottom.axhline(0, color="0.3", lw=0.8, ls="--")
    bottom.set_ylabel("FP8 - BF16 of its study\nand seed (% of BF16)", fontsize=9)
    bottom.set_xlabel(x_col)
    if not bottom.lines[:-1]:  # this model has only one precision (another model has both)
        bottom.text(0.5, 0.5, "needs a BF16 and an FP8 run", ha="center", transform=bottom.transAxes, color="0.4")


def mfu_figure(summary: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Model FLOPs utilisation as each run reported it, one panel per model and a bar per kind of run
    (the run of that kind with the highest MFU; the runs table lists every run). fp8lab's trainer and
    benchmarks divide by the GPU's dense BF16 peak for BF16 and FP8 runs alike, so the bars compare
    like with like."""
    title = "MFU (model FLOPs / dense BF16 peak, FP8 runs too): the best run of each kind"
    s = summary[summary["mfu"].notna() & ~fine_tune_rows(summary)] if len(summary) else summary  # pretraining's
    if not len(s):
        return _finish(_empty(title, "no MFU in these runs"), save)
    s = s.assign(_kind=[f"{variant_kind(v)}, {int(w) if pd.notna(w) else '?'} GPU" for v, w in
                        zip(s["variant"], s["world_size"])])
    s = s.loc[s.groupby(["model", "_kind"])["mfu"].idxmax()]
    models = _models(s)
    rows = max(min(MAX_BARS, int(s["model"].value_counts().max())), 1)
    small = len(models) > 2 * MAX_COLS  # many models: three panels a row, thinner bars, so the figure fits a screen
    fig, axes = _grid(len(models), width=4.6 if small else 5.0, height=(0.2 if small else 0.35) * rows + 1.1,
                      max_cols=MAX_COLS_SMALL if small else MAX_COLS)
    colors = _variant_colors(sorted(s["_kind"].unique()), dict(s[["_kind", "precision"]].values))
    for ax, model in zip(axes, models):
        g = s[s["model"] == model].sort_values(["precision", "_kind"]).head(MAX_BARS)
        ax.barh(range(len(g)), 100 * g["mfu"], color=[colors[k] for k in g["_kind"]])
        for y, v in enumerate(100 * g["mfu"]):
            ax.annotate(f"{v:.1f}%", (v, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_yticks(range(len(g)), list(g["_kind"]), fontsize=7 if small else 8)
        ax.set_ylim(rows - 0.5, -0.5)
        ax.set_xlim(0, 100 * float(s["mfu"].max()) * 1.2)
        ax.set_xlabel("MFU (% of dense BF16 peak)")
        ax.set_title(str(model), fontsize=10)
    fig.suptitle(title)
    return _finish(fig, save)


MAX_PROFILE_CATEGORIES = 7  # kernel categories a profile figure names (the rest: "other"), + the wall-time tick


def profile_figure(profiles: pd.DataFrame, include_flagged: bool = False, save: str | Path | None = None) -> Figure:
    """Where a step's GPU time goes: one stacked bar per profiled run (kernel ms per step by category).

    The step's wall time (unprofiled) is marked with a black tick: the gap between the bar's end
    and the tick is time the GPU sat idle (waiting for Python to launch kernels); concurrent NCCL
    kernels can push a bar past it. Profiles with a ``note`` (e.g. made by an older categoriser) are
    left out unless ``include_flagged``.
    """
    title = "GPU time per training step, by kernel category"
    p = profiles if include_flagged or not len(profiles) else profiles[profiles["note"].fillna("") == ""]
    if not len(p):
        return _finish(_empty(title, "no profiles (run with --profile-steps)"), save)
    runs = (p.drop_duplicates("run_id").assign(_size=lambda d: d["model"].map(model_size_b))
            .sort_values(["_size", "model", "layout", "precision", "variant"]))
    if len(runs) > MAX_BARS:  # a screen's worth: the table below the figure lists every profile
        title += f" ({MAX_BARS} of {len(runs)} profiled runs)"
        runs = runs.head(MAX_BARS)
    p = p[p["run_id"].isin(runs["run_id"])]
    cats = list(p.groupby("category")["ms"].sum().sort_values(ascending=False).index)
    if len(cats) > MAX_PROFILE_CATEGORIES:  # the legend stays short: the smallest categories as one
        keep = cats[:MAX_PROFILE_CATEGORIES - 1]
        p = p.assign(category=p["category"].where(p["category"].isin(keep), "other"))
        p = p.groupby(["run_id", "category"], as_index=False)["ms"].sum()
        cats = keep + ["other"]
    cmap = matplotlib.colormaps["tab10"]
    fig, axes = _new(width=9, height=0.5 * len(runs) + 3.0)
    ax = axes[0, 0]
    for y, (_, r) in enumerate(runs.iterrows()):
        left = 0.0
        mine = p[p["run_id"] == r["run_id"]].set_index("category")["ms"]
        for i, cat in enumerate(cats):
            w = float(mine.get(cat, 0.0))
            ax.barh(y, w, left=left, color=cmap(i % 10), label=cat if y == 0 else None)
            left += w
        if pd.notna(r["step_ms"]):
            ax.plot([r["step_ms"]] * 2, [y - 0.42, y + 0.42], color="black", lw=2,
                    label="step wall time" if y == 0 else None)
            if pd.notna(r["gpu_busy"]):
                ax.text(max(left, r["step_ms"]) * 1.01, y, f"busy {100 * r['gpu_busy']:.0f}%", va="center", fontsize=7)
    ax.set_yticks(range(len(runs)),
                  [f"{m} | {lay} | {v}" for m, lay, v in zip(runs["model"], runs["layout"], runs["variant"])],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms per optimizer step")
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=3, fontsize=7)
    return _finish(fig, save)


def cost_figure(costs: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Time (hours) and cost (USD) to train the token budget, per run, from ``analysis.cost_table``."""
    if len(costs):
        budget, price = costs["token_budget"].iloc[0], costs["price_per_instance_hour"].iloc[0]
        # the price with its date where the table carries it (fp8lab.analysis.estimates.price_words)
        at = costs["price_note"].iloc[0] if "price_note" in costs else f"${price:,.2f}/instance-hour"
        title = f"Time and cost to train {budget / 1e9:g}B tokens at {at}"
    else:
        title = "Time and cost to train the token budget"
    c = costs[costs["hours"].notna() & np.isfinite(costs["hours"])] if len(costs) else costs
    if not len(c):
        return _finish(_empty(title), save)
    if len(c) > MAX_BARS:  # every run is in the table; the figure shows the cheapest of each precision per model
        c = c.loc[c.groupby(["model", "precision"])["cost_usd"].idxmin()]
        title += "\n(the cheapest BF16 and FP8 run per model; the table lists every run)"
    c = c.assign(_size=c["model"].map(model_size_b)).sort_values(
        ["_size", "model", "instances", "precision", "variant"])
    labels = [f"{m} | {v} | {int(i)} inst" + (" (projected)" if p else "")
              for m, v, i, p in zip(c["model"], c["variant"], c["instances"].fillna(1), c["projected"])]
    labels = [f"{lab} [{r}]" if labels.count(lab) > 1 else lab for lab, r in zip(labels, c["run_id"])]
    colors = _variant_colors(list(c["variant"].unique()), dict(c[["variant", "precision"]].values))
    fig, axes = _new(ncols=2, width=5.5, height=0.4 * len(c) + 1.4, sharey=True)
    for ax, col, xlabel, fmt in ((axes[0, 0], "hours", "hours", "{:,.1f} h"),
                                 (axes[0, 1], "cost_usd", "cost (USD)", "${:,.0f}")):
        ax.barh(range(len(c)), c[col], color=[colors[v] for v in c["variant"]])
        for y, val in enumerate(c[col]):
            ax.annotate(fmt.format(val), (val, y), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
        ax.set_xlim(0, float(c[col].max()) * 1.25)
        ax.set_xlabel(xlabel)
    axes[0, 0].set_yticks(range(len(c)), labels, fontsize=8)
    axes[0, 0].invert_yaxis()
    fig.suptitle(title)
    return _finish(fig, save)


def scaling_figure(scaling: pd.DataFrame, save: str | Path | None = None) -> Figure:
    """Per-GPU scaling efficiency (tokens/s/GPU relative to the same set-up at the smallest scale),
    from ``analysis.scaling_table``: a line through each scale's median, a dot per run where a scale
    has several; 1.0 is perfect linear scaling."""
    title = "Per-GPU scaling efficiency"
    if not len(scaling):
        return _finish(_empty(title), save)
    by = scaling_axis(scaling)
    fig, axes = _new(width=6)
    ax = axes[0, 0]
    colors = _variant_colors(list(scaling["variant"].unique()), dict(scaling[["variant", "precision"]].values))
    for (model, var), g in scaling.groupby(["model", "variant"], sort=True):
        mid = g.groupby(by, as_index=False)["efficiency"].median()  # the line; each run is a dot
        ax.plot(mid[by], mid["efficiency"], marker="o", color=colors[var], label=f"{model} | {var}")
        if len(g) > len(mid):
            ax.scatter(g[by], g["efficiency"], s=12, color=colors[var], alpha=0.6)
    ax.axhline(1.0, color="0.3", lw=0.8, ls="--")
    ax.set_xlabel(_SCALE_LABEL[by])
    ax.set_xticks(sorted({int(v) for v in scaling[by].dropna()}))  # GPU and instance counts are whole numbers
    ax.set_ylabel("tokens/s/GPU over the same set-up at the smallest scale\n(reference: the run closest in time)",
                  fontsize=8)
    ax.set_ylim(0, max(1.1, float(scaling["efficiency"].max()) * 1.05))
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _finish(fig, save)


# ------------------------------------------------------------------------------ headline view

# The headline's bars, in one order in every panel: what a user starts from, the best BF16, then the
# best FP8 run of each backend and recipe, then the source's figure. Each FP8 kind has its own colour
# from a qualitative palette and its own hatching, so colour is never the only cue.
_RECIPE_ORDER = list(RECIPE_TABLE)  # each kind's colour and hatch: its row of fp8lab.fp8.recipe.TABLE
_RECIPE_STYLE = {kind: row.style for kind, row in RECIPE_TABLE.items()}
_TORCHAO_STYLE = ("#a6761d", "\\\\")
SOURCE_BAR_LABEL = "source blog: FP8 / its BF16 (reported, H100 P5)"


def _slot_order(role: str) -> tuple:
    """Where a headline role sits: plain HF, best BF16, TE recipes in ``_RECIPE_ORDER``, other backends."""
    if role == "plain HF BF16":
        return (0,)
    if role == "best BF16":
        return (1,)
    _, backend, recipe = (role.split() + ["", "", ""])[:3]
    return (2, backend != "te", backend, _RECIPE_ORDER.index(recipe) if recipe in _RECIPE_ORDER else 99, recipe)


def _role_style(role: str) -> tuple[object, str]:
    """(colour, hatch) of a headline bar."""
    if role == "plain HF BF16":
        return "0.6", ""
    if role == "best BF16":
        return "#1f4e9a", ""
    _, backend, recipe = (role.split() + ["", "", ""])[:3]
    return _TORCHAO_STYLE if backend == "torchao" else _RECIPE_STYLE.get(recipe, ("#666666", "++"))


def _slot_label(role: str) -> str:
    if role == "plain HF BF16":
        return "plain HF\nBF16"
    if role == "best BF16":
        return "best\nBF16"
    _, backend, recipe = (role.split() + ["", "", ""])[:3]
    return f"FP8 {backend.upper() if backend == 'te' else backend}\n{recipe}"


def _value_label(ax, x: float, v: float, note: str, top: float) -> None:
    """``note`` above the bar, or inside it where above would cross the 1.0 line (never on a line)."""
    lines = note.count("\n") + 1
    height_pt = ax.get_window_extent().height * 72 / ax.figure.dpi
    text_h = (lines * 8.0 + 3) / height_pt * top  # 6.5 pt text, ~8 pt per line, in data units
    above_ok = v >= 1.0 or v + text_h < 0.97
    if above_ok:
        ax.annotate(note, (x, v), xytext=(0, 2), textcoords="offset points", ha="center", va="bottom", fontsize=6.5)
    else:  # inside, from the top of the bar down (the bar is below 1.0, so the line is above the text)
        ax.annotate(note, (x, v), xytext=(0, -3), textcoords="offset points", ha="center", va="top", fontsize=6.5,
                    color="black", bbox={"fc": "white", "ec": "none", "alpha": 0.8, "pad": 0.5})


def headline_figure(best: pd.DataFrame, reference: pd.DataFrame | None = None,
                    save: str | Path | None = None) -> Figure:
    """Per model, a handful of bars: tokens/s/GPU relative to the best BF16 run (1.0) for plain
    `transformers` BF16, the best BF16 and the best FP8 run of each backend and recipe, from
    ``analysis.best_runs``, and the source's reported FP8 speedup over its own BF16 (hatched, outlined).
    Every panel has the same bars in the same order, each named on the x axis; each bar is labelled
    with its ratio, tokens/s/GPU and batch layout."""
    title = "Tokens/s/GPU relative to the best BF16 run, per model (one GPU)"
    if not len(best):
        return _finish(_empty(title), save)
    # the headline table's models (analysis.headline_table): FP8 runs with no BF16 run to compare against head nothing
    # one panel per model and GPU, as the table has a row per model and GPU (a GPU's runs are never mixed with
    # another's)
    gpu = best["gpu_name"].map(group_key)
    groups = [(m, g[g["role"] != "best FP8"]) for (m, _), g in best.groupby([best["model"], gpu], sort=False)
              if (g["role"] == "best BF16").any()]  # best FP8: its recipe's bar
    if len(groups) > MAX_HEADLINE_PANELS:  # a screen's worth: the models with the most bars (comparisons) first
        n_models = len(groups)
        def bars(x):  # measured roles, and the source's reported bar where there is one
            return x[1]["role"].nunique() + bool(reference is not None and len(reference_for(reference, x[0])))
        groups = sorted(groups, key=lambda x: -bars(x))[:MAX_HEADLINE_PANELS]  # stable: ties keep the table's order
        what = "models" if gpu.nunique() == 1 else "models and GPUs"
        title += f" (the {len(groups)} of {n_models} {what} with the most bars; all {n_models} in the table)"
    has_ref = reference is not None and len(reference)
    roles = sorted({r for _, g in groups for r in g["role"]}, key=_slot_order)
    with_ref = has_ref and any(len(reference_for(reference, m)) for m, _ in groups)
    slots = roles + ([SOURCE_BAR_LABEL] if with_ref else [])
    ticks = [_slot_label(r) for r in roles] + (["source\n(reported)"] if with_ref else [])
    fig, axes = _grid(len(groups), width=max(5.0, 0.8 * len(slots) + 1.2), height=3.3)
    fig.canvas.draw()  # axes sizes known: value labels are placed by the space they take
    for ax, (model, g) in zip(axes, groups):
        by_role = {r["role"]: r for _, r in g.iterrows()}
        ref = reference_for(reference, model) if has_ref else []
        values = [by_role[r]["relative_to_best_bf16"] for r in roles if r in by_role]
        if len(ref):
            values.append(ref["speedup"].iloc[0])
        top = 1.5 * max(values)
        ax.set_ylim(0, top)
        ax.axhline(1.0, color="0.3", lw=0.8, ls="--", zorder=0)
        for x, role in enumerate(roles):
            r = by_role.get(role)
            if r is None:
                ax.text(x, 0.02 * top, "not run", ha="center", va="bottom", fontsize=6.5, color="0.5")
                continue
            color, hatch = _role_style(role)
            v = r["relative_to_best_bf16"]
            ax.bar([x], [v], color=color, hatch=hatch, edgecolor="white", zorder=2)
            # the head in FP8 is named on its bar: the panel sets it beside runs whose head ran in BF16
            extra = "\nFP8 head" if FP8_HEAD in str(r.get("variant", "")).split() else ""
            if r.get("memory", PLAIN) != PLAIN:  # a memory mode is how the model fits this GPU: the bar says so
                extra += f"\n--memory {r['memory']}"
            _value_label(ax, x, v, f"{v:.2f}x\n{r['tokens_per_sec_per_gpu'] / 1000:,.1f}k\n{r['layout']}".replace(
                ", accum ", " ga") + extra, top)
        if with_ref:
            x = len(roles)
            if len(ref):
                v = ref["speedup"].iloc[0]
                ax.bar([x], [v], color="white", edgecolor="crimson", hatch="//", zorder=2)
                _value_label(ax, x, v, f"{v:.2f}x\nreported\n({ref['model_size'].iloc[0]})", top)
            else:
                ax.text(x, 0.02 * top, "none\nreported", ha="center", va="bottom", fontsize=6.5, color="0.5")
        ax.set_xticks(range(len(slots)), ticks, fontsize=7)
        ax.set_xlim(-0.6, len(slots) - 0.4)
        ax.set_ylabel("relative to best BF16", fontsize=8)
        ax.set_title(f"{model} ({g['gpu_name'].iloc[0]})", fontsize=10)
    fig.suptitle(title)
    return _finish(fig, save)


def plan_figure(curve: pd.DataFrame, planned: list[int] | None = None, save: str | Path | None = None) -> Figure:
    """Time and cost to train the token budget against the number of instances, BF16 against FP8, per
    model, from ``fp8lab.launch.plan_curve``; ``planned``: the instance counts of the jobs planned, drawn
    as large filled points (the rest of the curve small). Cost on a linear axis, so its rise with the
    instance count shows; what each estimate rests on is the cost table's ``basis`` column."""
    title = "Planned sweep: time and cost to train the token budget"
    if not len(curve):
        return _finish(_empty(title, "nothing planned"), save)
    tokens, itype = curve["tokens"].iloc[0], curve["instance_type"].iloc[0]
    planned = sorted(set(planned or ()))
    fig, axes = _new(ncols=2, width=6.0, height=4.6)
    models = _models(curve)
    styles = ["-", "--", ":", "-."]
    for mi, model in enumerate(models):
        for prec, g in curve[curve["model"] == model].groupby("precision", sort=True):
            g = g.sort_values("instances")
            color = matplotlib.colormaps["Oranges" if is_fp8(prec) else "Blues"](
                0.55 + 0.4 * mi / max(len(models) - 1, 1))
            kind = (f"one instance at {g['node_efficiency'].iloc[0]:.0%} of 8 x one GPU" if g["measured"].all()
                    else "assumed MFU, no measurement")
            mine = g[g["instances"].isin(planned)]
            for ax, col in ((axes[0, 0], "hours"), (axes[0, 1], "cost_usd")):
                ax.plot(g["instances"], g[col], styles[mi % 4], marker="o", ms=3, color=color,
                        label=f"{model} {prec.upper()} ({kind})")
                ax.plot(mine["instances"], mine[col], "o", ms=8, color=color, mec="black", mew=0.8, zorder=4)
    for ax, ylabel in ((axes[0, 0], "hours (wall clock, log axis)"), (axes[0, 1], "cost (USD)")):
        ax.set_xlabel(f"{itype} instances" + (" (large points: the jobs planned)" if planned else ""))
        ax.set_ylabel(ylabel)
        ax.set_xticks(sorted(curve["instances"].unique()))
        ax.grid(alpha=0.3, which="both")
    hours = axes[0, 0]
    hours.set_yscale("log")  # hours fall by the instance count: a log axis keeps every point readable
    hours.yaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    hours.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:,.4g}"))
    hours.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    cost = axes[0, 1]  # linear from 0: the cost's rise with more instances (start-up per instance) stays visible
    cost.set_ylim(0, 1.08 * float(curve["cost_usd"].max()))
    cost.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"${v:,.0f}"))
    hours.set_title("time", fontsize=10)
    at = (curve["price_note"].iloc[0] if "price_note" in curve
          else f"${curve['price_per_hour'].iloc[0]:,.2f}/instance-hour")
    cost.set_title(f"cost at {at}", fontsize=10)
    _shared_legend(fig, axes)
    fig.suptitle(f"{title} ({tokens / 1e9:g}B tokens), projected from measured one-GPU runs", fontsize=10)
    return _finish(fig, save)
