"""Loss parity against BF16's own noise (issue 31): validation loss of every run of a loss study that has
several BF16 seeds, each run's gap to the BF16 seeds' mean at each validation step, and the band the gap is
read against (max(0.5% of the mean, how far apart the BF16 seeds are)). ``plots.parity_figure`` draws it."""
from __future__ import annotations

import pandas as pd

from fp8lab.analysis.labels import is_fp8, is_false

MIN_BAND_PCT = 0.5  # issue 31: the band is never narrower than this, whatever the seeds' spread
COLUMNS = ["model", "study", "run_id", "variant", "precision", "recipe", "seed", "step", "tokens", "val_loss", "bf16_mean",
           "gap_pct", "band_pct", "bf16_seeds"]


def parity_curves(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per run and validation step, for each (model, study) whose BF16 runs differ in seed (two or more)
    and saw the same validation steps; empty when no study has that."""
    need = {"record", "val_loss", "seed", "precision", "study", "model", "step"}
    if not len(runs) or not need <= set(runs.columns):
        return pd.DataFrame(columns=COLUMNS)
    val = runs[(runs["record"] == "step") & runs["val_loss"].notna()]
    if "loss_comparable" in val:
        val = val[~val["loss_comparable"].map(is_false).astype(bool)]
    out = []
    for (model, study), g in val.groupby(["model", "study"], sort=False, dropna=False):  # a user's runs: no study
        bf16 = g[~g["precision"].map(is_fp8).astype(bool) & g["seed"].notna()]
        if bf16["seed"].nunique() < 2:
            continue
        by_step = bf16.pivot_table(index="step", columns="seed", values="val_loss", aggfunc="last").dropna()
        mean = by_step.mean(axis=1)
        band = (100 * (by_step.max(axis=1) - by_step.min(axis=1)) / mean).clip(lower=MIN_BAND_PCT)
        g = g[g["step"].isin(mean.index)]
        out.append(g.assign(bf16_mean=g["step"].map(mean), band_pct=g["step"].map(band),
                            bf16_seeds=by_step.shape[1],
                            gap_pct=100 * (g["val_loss"] / g["step"].map(mean) - 1)))
    if not out:
        return pd.DataFrame(columns=COLUMNS)
    return pd.concat(out)[COLUMNS].sort_values(["model", "study", "run_id", "step"]).reset_index(drop=True)
