"""Loss parity against BF16's own noise: the BF16 runs of one set-up that differ only in seed, their
mean and spread (the band an FP8 run's gap is read against: max(0.5% of the mean, max - min of the seeds)), and
per validation step each run's gap to that mean. ``headline`` quotes the final gap; ``plots.parity_figure`` draws
the curves. BF16 seeds are those ``compare_precisions`` would pair: same model, GPU, scale, study and batch layout,
the same tokens seen, loss comparable and finite."""
from __future__ import annotations

import pandas as pd

from fp8lab.analysis.labels import group_key, is_false, variant_label
from fp8lab.analysis.summary import LAYOUT_KEYS, SCALE_KEYS

MIN_BAND_PCT = 0.5  # the band is never narrower than this, whatever the seeds' spread
SET_UP_KEYS = SCALE_KEYS + LAYOUT_KEYS  # what two runs must share to pair (fp8lab.analysis.summary)
COLUMNS = ["model", "study", "run_id", "variant", "precision", "recipe", "seed", "step", "tokens", "val_loss",
           "bf16_mean", "gap_pct", "band_pct", "bf16_seeds"]


def band_pct(values) -> float:
    """The band in percent of the mean: max(MIN_BAND_PCT, the seeds' spread, max - min)."""
    s = pd.Series(values, dtype=float)
    return max(MIN_BAND_PCT, 100 * (s.max() - s.min()) / s.mean())


def against_seeds(bf16_losses, loss: float) -> dict[str, float | bool]:
    """``loss`` read against BF16 seeds' final losses: their mean, spread (max - min) and band, in loss units and
    percent of the mean, the gap to the mean and whether it is inside the band (the parity criterion)."""
    s = pd.Series(bf16_losses, dtype=float)
    mean, spread = float(s.mean()), float(s.max() - s.min())
    band = float(band_pct(s))
    gap = float(100 * (loss / mean - 1))
    return {"mean": mean, "spread": spread, "spread_pct": 100 * spread / mean, "band": band / 100 * mean,
            "band_pct": band, "gap": float(loss - mean), "gap_pct": gap, "in_band": bool(abs(gap) <= band)}


def seeds_label(n: int, spread_pct: float) -> str:
    """How every view names what a gap against several BF16 seeds is relative to."""
    return f"the mean of {int(n)} BF16 seeds ({spread_pct:.2f}% apart)"


def _same_set_up(frame: pd.DataFrame, like: pd.Series) -> pd.Series:
    """Rows of ``frame`` (summary or runs rows) on the set-up of ``like`` (SET_UP_KEYS, missing-aware)."""
    keep = pd.Series(True, index=frame.index)
    for k in SET_UP_KEYS:
        if k in frame:
            keep &= frame[k].map(group_key) == group_key(like.get(k))
    return keep


def bf16_seeds(summary: pd.DataFrame, baseline_run: str) -> pd.DataFrame:
    """Summary rows of the BF16 runs that differ from ``baseline_run`` (a BF16 run) only in seed, it included: one
    per seed, each with a final validation loss, the same tokens, loss comparable and finite."""
    return seeds_of(summary, baseline_run)


def seeds_of(summary: pd.DataFrame, run_id: str) -> pd.DataFrame:
    """Summary rows of the runs that differ from ``run_id`` only in seed, it included (:func:`bf16_seeds`; for an
    FP8 run also the same set-up of precision, backend and recipe: the same ``variant_label``): one per seed, each
    with a final validation loss, the same tokens, loss comparable and finite."""
    need = {"run_id", "precision", "seed", "val_loss", "tokens"}
    s = summary.drop_duplicates("run_id") if len(summary) else summary
    if not need <= set(s.columns) or run_id not in set(s["run_id"]):
        return s.iloc[0:0]
    base = s[s["run_id"] == run_id].iloc[0]
    b = s[_same_set_up(s, base) & (s["precision"] == base["precision"]) & (s["tokens"] == base["tokens"])
          & s["val_loss"].notna() & s["seed"].notna()]
    if base["precision"] != "bf16":  # FP8: the same recipe and settings, not another recipe's runs
        b = b[b.apply(lambda r: variant_label(r.to_dict()), axis=1) == variant_label(base.to_dict())]
    if "loss_comparable" in b:
        b = b[~b["loss_comparable"].map(is_false).astype(bool)]
    if "nonfinite_losses" in b:
        b = b[b["nonfinite_losses"].fillna(0) == 0]
    return b.drop_duplicates("seed")


def fp8_label(variant: str, n) -> str:
    """An FP8 set-up as the loss views name it: its variant, and the mean of its seeds where there are several."""
    return f"`{variant}`" + (f" (the mean of {int(n)} seeds)" if pd.notna(n) and n > 1 else "")


def parity_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and validation step, for each set-up whose BF16 runs differ in seed (two or more) and saw
    the same validation steps; empty when no set-up has that (a user's runs: one seed, often no validation)."""
    need = {"record", "val_loss", "seed", "precision", "model", "step"}
    if not len(runs) or not need <= set(runs.columns):
        return pd.DataFrame(columns=COLUMNS)
    val = runs[(runs["record"] == "step") & runs["val_loss"].notna()]
    if "loss_comparable" in val:
        val = val[~val["loss_comparable"].map(is_false).astype(bool)]
    keys = [k for k in SET_UP_KEYS if k in val]
    out = []
    for _, g in val.assign(**{f"_{k}": val[k].map(group_key) for k in keys}).groupby(
            [f"_{k}" for k in keys], sort=False, dropna=False):
        bf16 = g[(g["precision"] == "bf16") & g["seed"].notna()]
        if bf16["seed"].nunique() < 2:
            continue
        by_step = bf16.pivot_table(index="step", columns="seed", values="val_loss", aggfunc="last").dropna()
        mean = by_step.mean(axis=1)
        band = by_step.apply(band_pct, axis=1)
        g = g[g["step"].isin(mean.index)]
        out.append(g.assign(bf16_mean=g["step"].map(mean), band_pct=g["step"].map(band), bf16_seeds=by_step.shape[1],
                            gap_pct=100 * (g["val_loss"] / g["step"].map(mean) - 1)))
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(out)[COLUMNS].sort_values(["model", "study", "run_id", "step"]).reset_index(drop=True)
