"""Time to the same loss: from a loss study's validation curves, how many tokens FP8 needs to reach
the BF16 run's final validation loss (the mean of the BF16 seeds' where several ran; FP8's curve the mean of its
seeds'), and so how long and how much it costs against BF16 once FP8's tokens/s/GPU speed-up is counted.

Tokens/s alone flatters a precision whose loss falls slower; this is the number that counts both."""
from __future__ import annotations

import numpy as np
import pandas as pd

from fp8lab.analysis.conclusion import fmt_tokens



def _val(runs: pd.DataFrame, ids: list[str]) -> pd.DataFrame:
    """tokens x run validation loss of ``ids`` (step records; a run's summary repeats its last point)."""
    v = runs[runs["run_id"].isin(ids) & runs["val_loss"].notna() & runs["tokens"].notna()]
    if "record" in v:
        v = v[v["record"] == "step"]
    return v.pivot_table(index="tokens", columns="run_id", values="val_loss", aggfunc="last").sort_index()


def tokens_to_reach(curve: pd.Series, target: float) -> float:
    """The first token count where ``curve`` (validation loss by tokens) is at or below ``target``, interpolated
    linearly between evaluations; nan where it never gets there."""
    x, y = curve.index.to_numpy(dtype=float), curve.to_numpy(dtype=float)
    below = np.flatnonzero(y <= target)
    if not len(below):
        return float("nan")
    i = int(below[0])
    if i == 0:
        return float(x[0])
    x0, x1, y0, y1 = x[i - 1], x[i], y[i - 1], y[i]
    return float(x0 + (x1 - x0) * (y0 - target) / (y0 - y1))


def time_to_loss(answer, runs: pd.DataFrame) -> pd.DataFrame:
    """Per model of ``answer`` (an :class:`fp8lab.analysis.Answer`) with a loss study: BF16's final validation loss
    (``target``), the tokens BF16 and FP8 took to reach it, their ratio, and with the measured speed-up FP8's time
    to that loss relative to BF16's (``time_ratio`` < 1: sooner); with the answer's plan, the hours and cost of the
    token budget for BF16 and for FP8 scaled by the token ratio. ``runs``: the loss study's runs
    (:func:`fp8lab.analysis.headline_runs`' first value, or any runs table holding them)."""
    rows = []
    # one row per model: the row its time and cost are priced from (the instance's GPU where the model ran there)
    for a in (answer.row(m, priced=True) for m in dict.fromkeys(answer.rows["model"])):
        if not isinstance(a.get("loss_study"), str) or pd.isna(a["speedup"]):
            continue
        bf16_ids = [r.strip() for r in str(a.get("loss_bf16_runs") or a["loss_baseline_run"]).split(",") if r.strip()]
        fp8_ids = [r.strip() for r in str(a.get("loss_fp8_runs") or a["loss_fp8_run"]).split(",") if r.strip()]
        bf16, fp8 = _val(runs, bf16_ids), _val(runs, fp8_ids)
        if not len(bf16) or not len(fp8):
            continue
        bf16_mean = bf16.dropna().mean(axis=1)
        fp8_mean = fp8.dropna().mean(axis=1)
        target = float(bf16_mean.iloc[-1])
        fp8_tokens = tokens_to_reach(fp8_mean, target)
        bf16_tokens = float(bf16_mean.index[-1])
        ratio = fp8_tokens / bf16_tokens
        time_ratio = ratio / a["speedup"]
        row = {"model": a["model"], "loss_study": a["loss_study"], "target_val_loss": target,
               "bf16_seeds": bf16.shape[1], "fp8_seeds": fp8.shape[1], "bf16_tokens": bf16_tokens,
               "fp8_tokens": fp8_tokens, "token_ratio": ratio, "speedup": a["speedup"], "time_ratio": time_ratio,
               "fp8_final_gap_pct": 100 * (float(fp8_mean.iloc[-1]) / target - 1),
               "hours_bf16": a.get("hours_bf16"), "cost_bf16": a.get("cost_bf16"),
               "hours_fp8_same_loss": a.get("hours_fp8", np.nan) * ratio,
               "cost_fp8_same_loss": a.get("cost_fp8", np.nan) * ratio}
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", "loss_study", "target_val_loss", "bf16_seeds", "fp8_seeds",
                                       "bf16_tokens", "fp8_tokens", "token_ratio", "speedup", "time_ratio",
                                       "fp8_final_gap_pct", "hours_bf16", "cost_bf16", "hours_fp8_same_loss",
                                       "cost_fp8_same_loss"])


def sentence(row: pd.Series) -> str:
    """One row of :func:`time_to_loss` in words. No cost: the budget's cost is the speed-up's (the results table's
    column), and a second cost beside it, scaled by the token ratio, read as a contradiction."""
    who = f"FP8 (mean of {row['fp8_seeds']} seeds)" if row["fp8_seeds"] > 1 else "FP8"
    target = (f"BF16's final validation loss ({row['target_val_loss']:.4f}"
              + (f", mean of {row['bf16_seeds']} seeds)" if row["bf16_seeds"] > 1 else ")"))
    if np.isnan(row["fp8_tokens"]):
        return (f"{who} did not reach {target} within {fmt_tokens(row['bf16_tokens'])} tokens "
                f"({row['fp8_final_gap_pct']:+.2f}% at the end)")
    return (f"{who} reached {target} after {row['token_ratio']:.2f}x its tokens ({fmt_tokens(row['fp8_tokens'])} of "
            f"{fmt_tokens(row['bf16_tokens'])}): {row['time_ratio']:.2f}x BF16's time at {row['speedup']:.2f}x the "
            "tokens/s")
