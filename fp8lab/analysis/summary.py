"""From the tidy table to numbers: per-run summaries, BF16-vs-FP8 comparisons, time and cost, scaling.

``summarize_runs`` gives one row per run (steady-state throughput, MFU, memory, loss);
``compare_precisions`` pairs FP8 with BF16 runs of the same model and scale; the default price and
token budget live here (``fp8lab.analysis.answer`` prices a budget, with the plan's estimate);
``scaling_table`` is per-GPU efficiency against the smallest scale.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from fp8lab.analysis.labels import (group_key, is_false, is_fp8, is_hardware_fp8, layout_label, model_size_b,
                                    variant_label)
from fp8lab.analysis.load import META_COLUMNS
from fp8lab.core.hardware import DEFAULT_PRICES_USD_PER_HOUR, INSTANCES
from fp8lab.core.progress import progress

SMOOTHING_METHODS = ("ema", "window", "none")
# The scale a BF16/FP8 pair must share to be compared: same model on the same hardware and size, training the same
# task (a fine-tune's speed and loss are another workload's than pretraining's)
SCALE_KEYS = ("model", "gpu_name", "instances", "world_size", "parallel", "task")
# ... and, by default, the same study and batch layout: runs measured together, on equal shapes
# (a BF16 run with 8 accumulation steps against an FP8 run with 1 would flatter or hurt FP8)
LAYOUT_KEYS = ("study", "micro_batch_size", "grad_accum", "seq_len")

# Price used for time-and-cost estimates unless one is passed: the launcher's assumption, held in
# fp8lab.core.hardware (one place for it): the SageMaker AI on-demand training price of one
# ml.p5.48xlarge (8x H100) in us-east-1, USD per instance-hour, as listed around the source blog's
# date (2024-11). Not a quote: prices differ by region and changed since (AWS cut P5 prices in
# 2025). Pass your own.
DEFAULT_PRICE_PER_INSTANCE_HOUR = DEFAULT_PRICES_USD_PER_HOUR["ml.p5.48xlarge"]
DEFAULT_TOKEN_BUDGET = 24e9  # the source's epoch: 24 billion tokens
DEFAULT_GPUS_PER_INSTANCE = INSTANCES["ml.p5.48xlarge"].gpus  # P5: 8 GPUs per instance


def _check_smoothing(smoothing: str, span: int) -> None:
    if smoothing not in SMOOTHING_METHODS:
        raise ValueError(f"smoothing={smoothing!r}; allowed: {', '.join(SMOOTHING_METHODS)}")
    if not isinstance(span, (int, np.integer)) or isinstance(span, bool) or span < 1:
        raise ValueError(f"smoothing_span={span!r}; allowed: an integer >= 1")


def smooth(values: Sequence[float] | pd.Series, smoothing: str = "ema", span: int = 20) -> pd.Series:
    """Smoothed loss: exponential moving average ('ema', span like pandas), trailing mean ('window') or 'none'."""
    _check_smoothing(smoothing, span)
    s = pd.Series(values, dtype="float64").reset_index(drop=True)
    if smoothing == "ema":
        return s.ewm(span=span, adjust=True, ignore_na=True).mean()
    if smoothing == "window":
        return s.rolling(span, min_periods=1).mean()
    return s


def _last_ema(values: np.ndarray, span: int) -> float:
    """``smooth(values, "ema", span).iloc[-1]`` of finite ``values``, without a pandas call per run: the same
    recursion pandas' ewm (adjust=True) runs, operation for operation."""
    alpha = 2.0 / (span + 1.0)
    old_wt_factor, new_wt = 1.0 - alpha, 1.0
    weighted, old_wt = float(values[0]), 1.0
    for cur in values[1:].tolist():
        old_wt *= old_wt_factor
        if weighted != cur:  # as pandas: no rounding drift on a constant series
            weighted = old_wt * weighted + new_wt * cur
            weighted /= old_wt + new_wt
        old_wt += new_wt
    return weighted


def _nanmedian(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(np.median(x)) if len(x) else np.nan


def _nanmax(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return x.max() if len(x) else np.nan


def _throughput_stats(steps: dict, steady: np.ndarray) -> dict:
    """Step-derived throughput (median, quartiles), MFU, step time, memory and tokens of one run (``steps``: its
    step columns as arrays; ``steady``: which steps count for throughput)."""
    tps = steps["tokens_per_sec_per_gpu"][steady]
    return dict(
        tokens_per_sec_per_gpu=float(np.median(tps)) if len(tps) else np.nan,
        tps_p25=float(np.percentile(tps, 25)) if len(tps) else np.nan,
        tps_p75=float(np.percentile(tps, 75)) if len(tps) else np.nan,
        steady_steps=len(tps),
        mfu=_nanmedian(steps["mfu"][steady]),
        step_time_s=_nanmedian(steps["step_time_s"][steady]),
        max_mem_gib=_nanmax(steps["max_mem_gib"]),
        tokens=_nanmax(steps["tokens"]),
    )


def _loss_stats(steps: dict, smoothing: str, smoothing_span: int) -> tuple[dict, str | None]:
    """Final, smoothed and validation loss of one run, blanked (with a note) if any loss is non-finite."""
    row = {}
    loss = steps["loss"][np.isfinite(steps["loss"])]  # skipped (overflow) steps may carry no loss
    row["final_loss"] = loss[-1] if len(loss) else np.nan
    row["smoothed_loss"] = (np.nan if not len(loss) else _last_ema(loss, smoothing_span) if smoothing == "ema"
                            else smooth(loss, smoothing, smoothing_span).iloc[-1])
    val = steps["val_loss"][~np.isnan(steps["val_loss"]) & ~np.isnan(steps["step"])]
    row["val_loss"] = val[-1] if len(val) else np.nan
    # NaN/Inf losses: the run is flagged and shows no loss, rather than an older or another loss
    bad = steps["loss_nonfinite"] | np.isinf(steps["loss"]) | np.isinf(steps["val_loss"])
    row["nonfinite_losses"] = int(bad.sum())
    note = None
    if bad.any():
        note = (f"{int(bad.sum())} non-finite loss value(s) (NaN/Inf), the first at step "
                f"{steps['step'][bad].min():g}: loss not reported or compared")
        row["final_loss"] = row["smoothed_loss"] = row["val_loss"] = np.nan
    return row, note


def _apply_summary_record(row: dict, summ: dict, throughput_from: str) -> str:
    """Let a benchmark's summary record override the step-derived numbers; returns where throughput came from."""
    if pd.notna(summ.get("tokens_per_sec_per_gpu")):
        row["tokens_per_sec_per_gpu"] = summ["tokens_per_sec_per_gpu"]
        row["tps_p25"] = summ.get("tokens_per_sec_per_gpu_p25", np.nan)
        row["tps_p75"] = summ.get("tokens_per_sec_per_gpu_p75", np.nan)
        row["steady_steps"] = summ.get("timed_steps", np.nan)
        throughput_from = "benchmark summary record"
        if pd.isna(row["tps_p25"]) and pd.notna(summ.get("tokens_per_sec_per_gpu_min", np.nan)):
            row["tps_p25"] = summ["tokens_per_sec_per_gpu_min"]  # no quartiles: min-max of repeats
            row["tps_p75"] = summ.get("tokens_per_sec_per_gpu_max", np.nan)
            throughput_from += " (spread: min-max of repeats)"
    for key, src in (("mfu", "mfu"), ("max_mem_gib", "max_mem_gib"), ("step_time_s", "step_time_s"),
                     ("tokens", "tokens"), ("val_loss", "val_loss")):
        if pd.notna(summ.get(src, np.nan)):
            row[key] = summ[src]
    for key in ("final_loss", "loss"):
        if pd.isna(row["final_loss"]) and pd.notna(summ.get(key, np.nan)):
            row["final_loss"] = row["smoothed_loss"] = summ[key]
    return throughput_from


# the step columns a run's summary reads, as float arrays; a summary record's keys it may take over
_STEP_COLUMNS = ("step", "tokens_per_sec_per_gpu", "mfu", "step_time_s", "max_mem_gib", "tokens", "loss", "val_loss")
_SUMMARY_KEYS = ("tokens_per_sec_per_gpu", "tokens_per_sec_per_gpu_p25", "tokens_per_sec_per_gpu_p75", "timed_steps",
                 "tokens_per_sec_per_gpu_min", "tokens_per_sec_per_gpu_max", "mfu", "max_mem_gib", "step_time_s",
                 "tokens", "val_loss", "final_loss", "loss")


class _Columns:
    """The run table as NumPy arrays, read once: a run's summary takes its rows by position (a pandas frame per
    run was most of a report's time on thousands of runs)."""

    def __init__(self, runs: pd.DataFrame):
        meta = [c for c in META_COLUMNS if c != "run_id"]
        # each run's first non-null value of each metadata column, for all runs in one pass
        self.firsts = runs.groupby("run_id", sort=False)[meta].first().to_dict("index") if len(runs) else None
        self.floats = {c: pd.to_numeric(runs[c], errors="coerce").to_numpy(float) if c in runs else
                       np.full(len(runs), np.nan) for c in _STEP_COLUMNS}
        self.nonfinite = (runs["loss_nonfinite"].astype("boolean").fillna(False).to_numpy(bool)
                          if "loss_nonfinite" in runs else np.zeros(len(runs), bool))
        record = runs["record"].to_numpy(object)
        self.is_step, self.is_summary = record == "step", record == "summary"
        self.summary = {k: runs[k].to_numpy(object) for k in _SUMMARY_KEYS if k in runs}

    def run(self, run_id: object, pos: np.ndarray) -> tuple[dict, dict, dict | None]:
        """(first non-null metadata, step columns sorted by step, last summary record or None) of the rows ``pos``."""
        meta = self.firsts.get(run_id, {}) if self.firsts is not None else {}
        steps = pos[self.is_step[pos]]
        steps = steps[np.argsort(self.floats["step"][steps], kind="stable")]
        cols = {c: a[steps] for c, a in self.floats.items()}
        cols["loss_nonfinite"] = self.nonfinite[steps]
        summ = pos[self.is_summary[pos]]
        return meta, cols, ({k: v[summ[-1]] for k, v in self.summary.items()} if len(summ) else None)


def _summarize_run(run_id: object, meta: dict, steps: dict, summ: dict | None, warmup_steps: int, smoothing: str,
                   smoothing_span: int) -> dict:
    """The summary row of one run's records (see ``summarize_runs``)."""
    timed = ~np.isnan(steps["tokens_per_sec_per_gpu"])
    # by step number, not position: downsampled files keep exact step numbers
    steady = timed & (steps["step"] >= steps["step"][timed].min() + warmup_steps) if timed.any() else timed
    known = steps["step"][~np.isnan(steps["step"])]
    row = {"run_id": run_id, **meta, "n_steps": int(len(np.unique(known)))}
    row.update(_throughput_stats(steps, steady))
    note = []
    if timed.any() and not steady.any():
        note.append(f"all {int(timed.sum())} timed steps fall within warmup_steps={warmup_steps}")
    n_tps = row["steady_steps"]
    throughput_from = f"median of {n_tps} steps after {warmup_steps} warm-up" if n_tps else "none"
    loss_row, loss_note = _loss_stats(steps, smoothing, smoothing_span)
    row.update(loss_row)
    if loss_note is not None:
        note.append(loss_note)
    if summ is not None:
        throughput_from = _apply_summary_record(row, summ, throughput_from)
    for k in ("tps_p25", "tps_p75"):
        row[k] = pd.to_numeric(row[k], errors="coerce")
    row["tps_iqr"] = row["tps_p75"] - row["tps_p25"]
    row["tps_spread_pct"] = (100 * row["tps_iqr"] / row["tokens_per_sec_per_gpu"] if row["tokens_per_sec_per_gpu"]
                             else np.nan)
    row["throughput_from"] = throughput_from
    row["note"] = "; ".join(note)
    return row


def summarize_runs(runs: pd.DataFrame, warmup_steps: int = 10, smoothing: str = "ema",
                   smoothing_span: int = 20) -> pd.DataFrame:
    """One row per run: steady-state tokens/s/GPU (median, quartiles, spread), MFU, memory, loss.

    The first ``warmup_steps`` steps of each run (by step number, counted from its first logged step)
    are left out of throughput and MFU (compilation, allocator and FP8 amax warm-up). A benchmark's summary record,
    measured with its own timing, takes precedence over numbers derived from its steps.
    """
    if not isinstance(warmup_steps, (int, np.integer)) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps!r}; allowed: an integer >= 0")
    _check_smoothing(smoothing, smoothing_span)
    groups = runs.groupby("run_id", sort=False).indices  # run -> its rows' positions
    order = [r for r in pd.unique(runs["run_id"]) if r in groups]  # as groupby(sort=False) lists them: first seen first
    table = _Columns(runs)
    rows = [_summarize_run(run_id, *table.run(run_id, groups[run_id]), warmup_steps, smoothing, smoothing_span)
            for run_id in progress(order, "summarising runs", total=len(order), unit="run")]
    cols = (["run_id"] + [c for c in META_COLUMNS if c != "run_id"] +
            ["n_steps", "steady_steps", "tokens", "tokens_per_sec_per_gpu", "tps_p25", "tps_p75", "tps_iqr",
             "tps_spread_pct", "mfu", "step_time_s", "max_mem_gib", "final_loss", "smoothed_loss", "val_loss",
             "nonfinite_losses", "throughput_from", "note"])
    return pd.DataFrame(rows, columns=cols)


def same_seed(bf16: pd.DataFrame, seed) -> pd.DataFrame:
    """The BF16 runs among ``bf16`` with ``seed`` (the same initial weights and data order as the FP8 run of that
    seed), where they are a noise band (two or more seeds); none where the seed is unknown or there is one seed."""
    if "seed" not in bf16 or pd.isna(seed) or bf16["seed"].nunique() < 2:
        return bf16.iloc[0:0]
    return bf16[bf16["seed"] == seed]


def _same_seed(bf16: pd.DataFrame, fp8_run: pd.Series, fastest: pd.Series) -> pd.Series:
    """The BF16 baseline of an FP8 run: where several BF16 runs of one set-up differ in seed (a noise band),
    the one with the FP8 run's seed (:func:`same_seed`); else the fastest."""
    same = same_seed(bf16, fp8_run.get("seed"))
    return same.loc[same["tokens_per_sec_per_gpu"].idxmax()] if len(same) else fastest


def compare_precisions(summary: pd.DataFrame, baseline_backend: str | None = None,
                       loss: str = "smoothed", by_layout: bool = True) -> pd.DataFrame:
    """FP8 against BF16 per model and scale: speedup and loss gap in percent.

    Runs pair when they share model, GPU, instance count and world size and (``by_layout``) study,
    micro-batch, accumulation steps and sequence length. The BF16 baseline is the
    fastest BF16 run of that scale, or the one with ``baseline_backend`` (e.g. 'hf' for plain
    transformers). Loss gaps are given only when both runs saw the same number of tokens
    (``valid``); otherwise ``note`` says why. Speedup compares steady-state rates either way.
    ``loss``: 'smoothed' or 'final' training loss for ``loss_gap_pct`` (``val_loss_gap_pct`` too).
    """
    if loss not in ("smoothed", "final"):
        raise ValueError(f"loss={loss!r}; allowed: 'smoothed', 'final'")
    cols = ["model", "gpu_name", "instances", "world_size", "layout", "study", "baseline_run", "baseline_variant",
            "fp8_run",
            "fp8_variant", "tps_baseline", "tps_fp8", "speedup", "mfu_baseline", "mfu_fp8", "tokens_baseline",
            "tokens_fp8", "valid", "hardware_fp8", "loss_baseline", "loss_fp8", "loss_gap_pct", "val_loss_baseline",
            "val_loss_fp8", "val_loss_gap_pct", "note", "task"]
    rows = []
    if not len(summary):
        return pd.DataFrame(columns=cols)
    keys = SCALE_KEYS + (LAYOUT_KEYS if by_layout else ())
    keyed = summary.assign(**{f"_{k}": (summary[k] if k in summary
                                        else pd.Series(None, index=summary.index, dtype=object)).map(group_key)
                              for k in keys})
    for scale, g in keyed.groupby([f"_{k}" for k in keys], sort=True, dropna=False):
        bf16 = g[g["precision"] == "bf16"]
        if baseline_backend is not None:
            bf16 = bf16[bf16["backend"] == baseline_backend]
        bf16 = bf16[bf16["tokens_per_sec_per_gpu"].notna()]
        fp8 = g[g["precision"].map(is_fp8)]
        if not len(bf16) or not len(fp8):
            continue
        fastest = bf16.loc[bf16["tokens_per_sec_per_gpu"].idxmax()]
        lcol = "smoothed_loss" if loss == "smoothed" else "final_loss"
        for _, r in fp8.iterrows():
            base = _same_seed(bf16, r, fastest)
            note = []
            hardware = is_hardware_fp8(r)
            if not hardware:
                note.append("FP8 emulated or on CPU: its speed says nothing about FP8 hardware")
            same = pd.notna(base["tokens"]) and pd.notna(r["tokens"]) and base["tokens"] == r["tokens"]
            nonfinite = [x["run_id"] for x in (base, r) if x.get("nonfinite_losses", 0) > 0]
            if nonfinite:
                note.append(f"non-finite loss (NaN/Inf) in {', '.join(map(str, nonfinite))}: loss not compared")
            if is_false(base.get("loss_comparable")) or is_false(r.get("loss_comparable")):
                same = False
                note.append("throughput run: too short for a loss comparison (see the loss-parity study)")
            elif pd.isna(base["tokens"]) or pd.isna(r["tokens"]):
                note.append("tokens seen unknown: loss not compared")
            elif not same:
                note.append(f"different tokens seen ({base['tokens']:.0f} vs {r['tokens']:.0f}): loss not compared")
            gap = 100 * (r[lcol] - base[lcol]) / base[lcol] if same and not nonfinite else np.nan
            vgap = 100 * (r["val_loss"] - base["val_loss"]) / base["val_loss"] if same and not nonfinite else np.nan
            rows.append({
                **dict(zip(SCALE_KEYS, [base[k] for k in SCALE_KEYS])),
                "layout": layout_label(base) if by_layout else "-", "study": base.get("study"),
                "baseline_run": base["run_id"], "baseline_variant": base["variant"],
                "fp8_run": r["run_id"], "fp8_variant": r["variant"],
                "tps_baseline": base["tokens_per_sec_per_gpu"], "tps_fp8": r["tokens_per_sec_per_gpu"],
                "speedup": r["tokens_per_sec_per_gpu"] / base["tokens_per_sec_per_gpu"],
                "mfu_baseline": base["mfu"], "mfu_fp8": r["mfu"],
                "tokens_baseline": base["tokens"], "tokens_fp8": r["tokens"], "valid": bool(same),
                "hardware_fp8": hardware,
                "loss_baseline": base[lcol], "loss_fp8": r[lcol], "loss_gap_pct": gap,
                "val_loss_baseline": base["val_loss"], "val_loss_fp8": r["val_loss"], "val_loss_gap_pct": vgap,
                "note": "; ".join(note),
            })
    out = pd.DataFrame(rows, columns=cols)
    if len(out):  # smallest model first, then scale, then fastest FP8 variant
        order = out.assign(_size=out["model"].map(model_size_b).fillna(np.inf), _neg=-out["speedup"])
        out = out.loc[order.sort_values(["_size", "model", "world_size", "instances", "_neg"]).index]
    return out.reset_index(drop=True)


def check_cost_args(tokens: float, price: float, gpus_per_instance: int) -> None:
    if not (isinstance(tokens, (int, float)) and tokens > 0):
        raise ValueError(f"tokens={tokens!r}; allowed: a number > 0 (e.g. 24e9)")
    if not (isinstance(price, (int, float)) and price >= 0):
        raise ValueError(f"price_per_instance_hour={price!r}; allowed: a number >= 0 (USD)")
    if not isinstance(gpus_per_instance, (int, np.integer)) or gpus_per_instance < 1:
        raise ValueError(f"gpus_per_instance={gpus_per_instance!r}; allowed: an integer >= 1")


def _setup_label(row: dict) -> str:
    """The set-up a scaling row compares: what ran (``variant_label``) and the layout, without the
    scale and the data-parallel mode, e.g. 'fp8 te delayed fused bf16-params, 16x2048, accum 4'."""
    one = {**row, "parallel": None}
    return f"{variant_label(one)}, {layout_label(row)}"


def scaling_table(summary: pd.DataFrame, by: str = "auto") -> pd.DataFrame:
    """Per-GPU scaling efficiency of each run against the same set-up at the smallest scale.

    Runs count as one set-up when model, GPU, precision, backend, recipe, parameter dtype and layout
    (micro-batch, accumulation, sequence) agree; the variant's name and the data-parallel mode do not
    matter. The reference is the smallest-scale run of the set-up measured closest in time (the same
    session and machine where there is one: GPUs of one kind differ by a few percent between machines);
    ``efficiency_vs_fastest`` divides by the fastest smallest-scale run instead. Set-ups measured at one
    scale only are left out. 1.0 means perfect linear scaling. ``by``: 'instances', 'world_size'
    (GPUs), or 'auto' (instances when runs differ in instance count, else GPUs).
    """
    if by == "auto":
        by = "instances" if summary["instances"].nunique() > 1 else "world_size"
    if by not in ("instances", "world_size"):
        raise ValueError(f"by={by!r}; allowed: 'auto', 'instances', 'world_size'")
    kept = ["model", "gpu_name", "variant", "precision", "instances", "world_size", "run_id", "tokens_per_sec_per_gpu"]
    cols = kept + ["reference_run_id", "reference_tokens_per_sec_per_gpu", "hours_apart", "efficiency",
                   "efficiency_vs_fastest"]
    s = summary[summary["tokens_per_sec_per_gpu"].notna() & summary[by].notna()].copy()
    empty = pd.DataFrame(columns=cols)
    empty.attrs["by"] = by
    if not len(s):
        return empty
    s["variant"] = [_setup_label(r) for r in s.to_dict("records")]
    s["_when"] = pd.to_datetime(s["date"], utc=True, errors="coerce") if "date" in s else pd.NaT
    keys = [s["model"].map(group_key), s["gpu_name"].map(group_key), s["variant"]]
    rows = []

    def row(r: pd.Series, ref: pd.Series, hours: float, fastest: float) -> dict:
        return {**{c: r[c] for c in kept}, "reference_run_id": ref["run_id"],
                "reference_tokens_per_sec_per_gpu": ref["tokens_per_sec_per_gpu"], "hours_apart": hours,
                "efficiency": r["tokens_per_sec_per_gpu"] / ref["tokens_per_sec_per_gpu"],
                "efficiency_vs_fastest": r["tokens_per_sec_per_gpu"] / fastest}

    for _, g in s.groupby(keys, sort=True):
        if g[by].nunique() < 2:
            continue
        base = g[g[by] == g[by].min()]
        fastest = float(base["tokens_per_sec_per_gpu"].max())
        used: set = set()
        for _, r in g.sort_values([by, "run_id"]).iterrows():
            if r[by] == base[by].iloc[0]:
                continue
            gap = (base["_when"] - r["_when"]).abs()
            ref = (base.loc[gap.idxmin()] if gap.notna().any()
                   else base.sort_values("tokens_per_sec_per_gpu").iloc[len(base) // 2])
            used.add(ref["run_id"])
            hours = gap[ref.name] / pd.Timedelta(hours=1) if gap.notna().any() else float("nan")
            rows.append(row(r, ref, hours, fastest))
        for _, r in base[base["run_id"].isin(used)].iterrows():  # the references themselves, at 1.0
            rows.append(row(r, r, 0.0, fastest))
    if not rows:
        return empty
    out = pd.DataFrame(rows)[cols].sort_values(["model", "variant", by, "run_id"], ignore_index=True)
    out.attrs["by"] = by  # the scale column the efficiencies are over (plots and reports read it)
    return out


def scaling_axis(scaling: pd.DataFrame) -> str:
    """The scale column a ``scaling_table`` compares over: 'instances' or 'world_size'."""
    return scaling.attrs.get("by") or ("instances" if scaling["instances"].nunique() > 1 else "world_size")
