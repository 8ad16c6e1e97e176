"""The headline view: what a reader needs first, per model, each row naming the run it comes from.

``best_runs`` picks the runs a headline shows (plain `transformers` BF16, best BF16, best FP8 and
the best FP8 per recipe), ``headline_table`` is one row per model with the speedups and the loss
gap of the loss study, ``headline_runs`` the runs behind it; ``DETAILS`` are notebook 05's views.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fp8lab.analysis import parity
from fp8lab.analysis.labels import (fine_tune_rows, group_key, is_flag, is_fp8, is_hardware_fp8, is_true, layout_label,
                                    model_size_b)
from fp8lab.analysis.load import reference_for
from fp8lab.analysis.peers import peer_rows
from fp8lab.analysis.summary import compare_precisions
from fp8lab.plan import memory_modes

# What a reader needs first, per model: the plain `transformers` BF16 run a user starts from, the
# best BF16 fp8lab measured, the best FP8 (overall and per recipe), the loss gap of the loss study,
# and the source's reported figure. Every row names the run it comes from.

HEADLINE_COLUMNS = [
    "model", "gpu_name", "world_size",
    "hf_run", "hf_variant", "hf_layout", "tps_hf",
    "bf16_run", "bf16_variant", "bf16_layout", "tps_bf16", "mfu_bf16",
    "fp8_run", "fp8_variant", "fp8_layout", "tps_fp8", "mfu_fp8", "hardware_fp8",
    "speedup", "speedup_vs_hf",
    "loss_gap_pct", "loss_gap_kind", "loss_fp8_run", "loss_baseline_run", "loss_fp8_variant", "loss_study",
    "loss_tokens",
    # where a loss study has several BF16 seeds, loss_gap_pct is to their mean; how far apart they ended,
    # which runs they are, and whether the gap is inside the band max(0.5%, that spread)
    "loss_bf16_seeds", "loss_bf16_spread_pct", "loss_bf16_runs", "loss_in_band",
    # and where that FP8 set-up has several seeds too, the gap is of their mean (which runs, how many)
    "loss_fp8_seeds", "loss_fp8_runs",
    "source_model_size", "source_speedup", "source_loss_gap_pct",
]
BEST_RUN_COLUMNS = ["model", "gpu_name", "world_size", "role", "run_id", "variant", "layout", "precision", "backend",
                    "recipe", "study", "tokens_per_sec_per_gpu", "mfu", "relative_to_best_bf16", "hardware_fp8",
                    "memory"]


def _is_plain_hf(row) -> bool:
    """Plain `transformers` layers, not compiled: what a user runs before trying anything."""
    return row.get("backend") == "hf" and not is_true(row.get("compile"))


def _same_sequence(g: pd.DataFrame) -> pd.DataFrame:
    """The runs at one sequence length, so best BF16 and best FP8 compare like with like: the shortest
    length at which both precisions ran (all of ``g`` where no such length, or no length is recorded)."""
    if "seq_len" not in g or g["seq_len"].isna().all():
        return g
    both = [n for n, x in g.groupby("seq_len") if (x["precision"] == "bf16").any() and x["precision"].map(is_fp8).any()]
    return g[g["seq_len"] == min(both)] if both else g


def _same_memory(g: pd.DataFrame) -> pd.DataFrame:
    """The runs in one memory mode (fp8lab.plan.memory_modes), so best BF16 and best FP8 keep their states alike: the
    first mode in ``--memory``'s order (plain, then the least lossy) in which both precisions ran (all of ``g`` where
    none)."""
    if "memory" not in g:
        return g
    mode = g["memory"].map(memory_modes.of_record)
    bf16, fp8 = g["precision"] == "bf16", g["precision"].map(is_fp8)
    both = [m for m in memory_modes.NAMES if (bf16 & (mode == m)).any() and (fp8 & (mode == m)).any()]
    return g[mode == both[0]] if both else g


def _headline_groups(summary: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(model, GPU) groups at their smallest measured scale (one GPU where measured), in one memory mode
    (:func:`_same_memory`) and at one sequence length (:func:`_same_sequence`), smallest model first."""
    s = summary[summary["tokens_per_sec_per_gpu"].notna()] if len(summary) else summary
    if len(s):  # a peer's runs (fp8lab.analysis.peers) are not fp8lab's: their own table shows them
        s = s[~peer_rows(s)]
    if len(s):  # the headline is pretraining's: a fine-tune's runs pair in their own study
        s = s[~fine_tune_rows(s)]
    out = []
    for (model, gpu), g in s.groupby([s["model"].map(group_key), s["gpu_name"].map(group_key)], sort=False):
        inst = g["instances"].fillna(1)
        g = g[inst == inst.min()]
        ws = g["world_size"].fillna(1)
        out.append(((model, gpu), _same_sequence(_same_memory(g[ws == ws.min()]))))
    return sorted(out, key=lambda kg: (np.nan_to_num(model_size_b(kg[0][0]), nan=np.inf), str(kg[0][0]), str(kg[0][1])))


def best_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Per model (and GPU), at its smallest measured scale, the runs a headline shows: ``role`` is
    'plain HF BF16' (fastest plain `transformers` BF16 run, not compiled), 'best BF16' (fastest BF16 run
    of any backend), 'best FP8' (fastest FP8 run), and 'FP8 <backend> <recipe>' (fastest FP8 run per
    backend and recipe kind, fastest first). ``relative_to_best_bf16`` is tokens/s/GPU over the best BF16's."""
    rows = []
    for (model, gpu), g in _headline_groups(summary):
        bf16 = g[g["precision"] == "bf16"]
        fp8 = g[g["precision"].map(is_fp8)]
        hw = fp8[[is_hardware_fp8(r) for _, r in fp8.iterrows()]]
        fp8 = hw if len(hw) else fp8  # emulated FP8 only where nothing ran on FP8 hardware
        picks = []
        hf = bf16[[_is_plain_hf(r) for _, r in bf16.iterrows()]]
        if len(hf):
            picks.append(("plain HF BF16", hf.loc[hf["tokens_per_sec_per_gpu"].idxmax()]))
        if len(bf16):
            picks.append(("best BF16", bf16.loc[bf16["tokens_per_sec_per_gpu"].idxmax()]))
        if len(fp8):
            picks.append(("best FP8", fp8.loc[fp8["tokens_per_sec_per_gpu"].idxmax()]))
            kinds = fp8.assign(_kind=[f"FP8 {r['backend']} {r['recipe']}" for _, r in fp8.iterrows()])
            best = [kinds.loc[k["tokens_per_sec_per_gpu"].idxmax()] for _, k in kinds.groupby("_kind", sort=True)]
            picks += [(r["_kind"], r) for r in sorted(best, key=lambda r: -r["tokens_per_sec_per_gpu"])]
        ref = picks[[p[0] for p in picks].index("best BF16")][1]["tokens_per_sec_per_gpu"] if len(bf16) else np.nan
        for role, r in picks:
            rows.append({"model": model, "gpu_name": gpu, "world_size": r["world_size"], "role": role,
                         "run_id": r["run_id"], "variant": r["variant"], "layout": layout_label(r),
                         "precision": r["precision"], "backend": r["backend"], "recipe": r["recipe"],
                         "study": r["study"], "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"], "mfu": r["mfu"],
                         "relative_to_best_bf16": r["tokens_per_sec_per_gpu"] / ref,
                         "hardware_fp8": is_hardware_fp8(r) if is_fp8(r["precision"]) else np.nan,
                         "memory": memory_modes.of_record(r.get("memory"))})
    return pd.DataFrame(rows, columns=BEST_RUN_COLUMNS)


def _headline_loss(comparison: pd.DataFrame, summary: pd.DataFrame, model: str, recipe: object) -> dict | None:
    """The loss gap a headline quotes for ``model``: from the runs that saw the same tokens, preferring
    the FP8 recipe of the best FP8 run without loss remedies (own recipe settings, BF16 edge blocks) or the FP8 head,
    then the most tokens, then the newest study."""
    if not len(comparison):
        return None
    c = comparison[(comparison["model"] == model) & comparison["valid"].astype(bool)]
    # pretraining's loss, as the headline's speed (a fine-tune of that model is another study)
    c = c[~c["fp8_run"].isin(summary.loc[fine_tune_rows(summary), "run_id"])]
    c = c[c["val_loss_gap_pct"].notna() | c["loss_gap_pct"].notna()]
    if not len(c):
        return None
    meta = summary.drop_duplicates("run_id").set_index("run_id")

    def rank(r):
        m = meta.loc[r["fp8_run"]] if r["fp8_run"] in meta.index else {}
        spec = m.get("recipe_spec") if isinstance(m.get("recipe_spec"), str) else ""
        edge = m.get("bf16_edge_blocks")
        plain = (":" not in spec
                 and not (isinstance(edge, (int, float, np.integer, np.floating)) and not pd.isna(edge) and edge > 0)
                 # the FP8 head over the full logits is a study's set-up (in the fused loss's chunks, auto's choice)
                 and not (is_flag(m.get("fp8_lm_head")) and not is_flag(m.get("fused_loss"))))
        when = pd.to_datetime(m.get("date"), utc=True, errors="coerce")
        return (m.get("recipe") == recipe, plain, r["tokens_fp8"], when.value if pd.notna(when) else 0)

    r = max((r for _, r in c.iterrows()), key=rank)
    val = pd.notna(r["val_loss_gap_pct"])
    out = {"loss_gap_pct": r["val_loss_gap_pct"] if val else r["loss_gap_pct"],
           "loss_gap_kind": "validation loss" if val else "smoothed training loss",
           "loss_fp8_run": r["fp8_run"], "loss_baseline_run": r["baseline_run"], "loss_fp8_variant": r["fp8_variant"],
           "loss_study": r["study"], "loss_tokens": r["tokens_fp8"], "loss_bf16_seeds": 1,
           "loss_bf16_spread_pct": np.nan,
           "loss_bf16_runs": r["baseline_run"], "loss_in_band": np.nan, "loss_fp8_seeds": 1,
           "loss_fp8_runs": r["fp8_run"]}
    seeds = parity.bf16_seeds(summary, r["baseline_run"]) if val else summary.iloc[0:0]
    fp8_val = meta.loc[r["fp8_run"], "val_loss"] if val and r["fp8_run"] in meta.index else None
    if len(seeds) >= 2 and pd.notna(fp8_val):  # several BF16 seeds saw the same tokens: the gap is to their mean
        fp8 = parity.seeds_of(summary, r["fp8_run"])
        if len(fp8) >= 2:  # and several seeds of this FP8 set-up: their mean, not whichever run ranked first
            fp8_val = float(fp8["val_loss"].mean())
            out.update(loss_fp8_seeds=len(fp8), loss_fp8_runs=", ".join(map(str, fp8["run_id"])))
        band = parity.against_seeds(seeds["val_loss"], fp8_val)
        out.update(loss_gap_pct=band["gap_pct"], loss_bf16_seeds=len(seeds), loss_bf16_spread_pct=band["spread_pct"],
                   loss_bf16_runs=", ".join(map(str, seeds["run_id"])), loss_in_band=band["in_band"])
    return out


def headline_table(summary: pd.DataFrame, comparison: pd.DataFrame | None = None,
                   reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per model (and GPU) at its smallest measured scale: plain `transformers` BF16, best BF16,
    best FP8 (tokens/s/GPU, MFU, the run behind each), the speedup of best FP8 over best BF16 and over
    plain transformers, the FP8 loss gap of the loss study (see :func:`_headline_loss`), and the source's
    reported figures for the same model size (NaN where the source reported none)."""
    comparison = compare_precisions(summary) if comparison is None else comparison
    best = best_runs(summary)
    rows = []
    for (model, gpu), g in best.groupby([best["model"], best["gpu_name"].map(group_key)], sort=False):
        pick = {r["role"]: r for _, r in g.iterrows()}
        if "best FP8" in pick and "best BF16" not in pick:
            continue  # FP8 runs with no BF16 run to compare against (a loss check's model): nothing to head
        row = {"model": model, "gpu_name": gpu, "world_size": g["world_size"].iloc[0]}
        for prefix, role in (("hf", "plain HF BF16"), ("bf16", "best BF16"), ("fp8", "best FP8")):
            r = pick.get(role)
            row.update({f"{prefix}_run": r["run_id"] if r is not None else None,
                        f"{prefix}_variant": r["variant"] if r is not None else None,
                        f"{prefix}_layout": r["layout"] if r is not None else None,
                        f"tps_{prefix}": r["tokens_per_sec_per_gpu"] if r is not None else np.nan})
            if prefix != "hf":
                row[f"mfu_{prefix}"] = r["mfu"] if r is not None else np.nan
        row["hardware_fp8"] = bool(pick["best FP8"]["hardware_fp8"]) if "best FP8" in pick else np.nan
        row["speedup"] = row["tps_fp8"] / row["tps_bf16"]
        row["speedup_vs_hf"] = row["tps_fp8"] / row["tps_hf"]
        row.update(_headline_loss(comparison, summary, model,
                                  pick["best FP8"]["recipe"] if "best FP8" in pick else None)
                   or {})
        same = reference_for(reference, model)
        if len(same):
            row.update(source_model_size=same["model_size"].iloc[0], source_speedup=same["speedup"].iloc[0],
                       source_loss_gap_pct=same["loss_gap_pct"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def headline_runs(runs: pd.DataFrame, summary: pd.DataFrame,
                  headline: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs behind a headline: (loss runs: the runs of each model's loss study that its loss gap reads, the BF16
    seeds and the FP8 seeds of its set-up, for the loss figures; best: the summary rows of each model's best BF16
    and best FP8 run, for time and cost). ``detail="all"`` views draw every run."""
    loss_keys = {(m, s) for m, s in zip(headline["model"], headline["loss_study"]) if isinstance(s, str)}
    quoted = loss_run_ids(headline)
    loss = runs[[(m, s) in loss_keys and r in quoted
                 for m, s, r in zip(runs["model"], runs["study"], runs["run_id"])]] \
        if len(runs) else runs
    ids = set(headline["bf16_run"].dropna()) | set(headline["fp8_run"].dropna())
    return loss, summary[summary["run_id"].isin(ids)]


def loss_run_ids(headline: pd.DataFrame) -> set[str]:
    """The run ids a headline's loss columns quote (comma-separated): the runs whose steps its loss figures draw."""
    quoted = set()
    for col in ("loss_baseline_run", "loss_bf16_runs", "loss_fp8_run", "loss_fp8_runs"):
        if col in headline:
            quoted |= {r for v in headline[col].dropna() for r in str(v).split(", ")}
    return quoted


DETAILS = ("headline", "all")  # notebook 05's views: the answer per model, or every run


def check_detail(detail: str) -> str:
    """``detail`` if it names a view of notebook 05 ('headline' or 'all'), else a ValueError listing them."""
    if detail not in DETAILS:
        raise ValueError(f"detail={detail!r}; allowed: {', '.join(map(repr, DETAILS))}")
    return detail
