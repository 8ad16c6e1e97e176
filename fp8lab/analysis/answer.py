"""The answer, computed once from the runs: per model the BF16 and FP8 runs it rests on (and why),
speedup, MFU, the loss gap and the study it comes from, and the time and cost of a token budget.

Every view renders this one object: the README's results block and ``docs/results.md``
(``fp8lab report --docs``), the HTML report, notebook 05's headline, verdict and cost chart. The
time and cost come from the estimate that plans P5 jobs (:class:`fp8lab.analysis.estimates.MeasuredEstimate`,
what ``fp8lab launch plan`` and notebook 04 print), resting on the chosen runs: one formula.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp8lab.analysis.conclusion import verdict_parts
from fp8lab.analysis.estimates import MeasuredEstimate, price_words
from fp8lab.analysis.headline import HEADLINE_COLUMNS, headline_table
from fp8lab.analysis.scaling import instance_table
from fp8lab.analysis.time_to_loss import time_to_loss as same_loss_table
from fp8lab.core.hardware import INSTANCES, on_instance_gpu
from fp8lab.core.prices import Price, price_of
from fp8lab.model.models import MODEL_CONFIGS
from fp8lab.analysis.summary import (DEFAULT_GPUS_PER_INSTANCE, DEFAULT_PRICE_PER_INSTANCE_HOUR, DEFAULT_TOKEN_BUDGET,
                                     check_cost_args, compare_precisions)

ANSWER_INSTANCE = "ml.p5.48xlarge"  # the budget is priced on one P5, as notebook 04 plans it
WHY_BF16 = "the fastest BF16 run at the model's smallest measured scale"
WHY_FP8 = "the fastest FP8 run on FP8 hardware at that scale (emulated FP8 only where none ran on hardware)"
COST_COLUMNS = ["hours_bf16", "cost_bf16", "hours_fp8", "cost_fp8", "saved_pct", "cost_note"]
ANSWER_COLUMNS = HEADLINE_COLUMNS + ["why_bf16", "why_fp8"] + COST_COLUMNS


@dataclass(frozen=True)
class Answer:
    """One row per model (``rows``: :data:`ANSWER_COLUMNS`), with what it was computed from and under."""

    rows: pd.DataFrame
    comparison: pd.DataFrame
    reference: pd.DataFrame | None
    tokens: float
    price_per_instance_hour: float
    instance_type: str
    estimate: object  # the MeasuredEstimate the costs come from
    price: Price | None = None  # price_per_instance_hour with its date and source (fp8lab.core.prices)

    @classmethod
    def of(cls, summary: pd.DataFrame, comparison: pd.DataFrame | None = None,
           reference: pd.DataFrame | None = None, tokens: float = DEFAULT_TOKEN_BUDGET,
           price_per_instance_hour: float | str | Price | None = DEFAULT_PRICE_PER_INSTANCE_HOUR,
           instance_type: str = ANSWER_INSTANCE) -> "Answer":
        """The answer of a per-run summary (:func:`summarize_runs`); costs on one ``instance_type`` at
        ``price_per_instance_hour`` (a number, None for the default, "lookup" or a Price: fp8lab.core.prices)."""
        price = price_of(instance_type, price_per_instance_hour, name="price_per_instance_hour")
        price_per_instance_hour = price.usd_per_hour
        check_cost_args(tokens, price_per_instance_hour, DEFAULT_GPUS_PER_INSTANCE)
        comparison = compare_precisions(summary) if comparison is None else comparison
        head = headline_table(summary, comparison, reference)
        est = MeasuredEstimate.of_summary(summary)
        costs = [_costs(est, r, tokens, price_per_instance_hour, instance_type) for _, r in head.iterrows()]
        # a model measured on the instance's GPU (P5's H100) is priced from that row, what the plan rests on: its
        # rows on other GPUs quote that row's time and cost, and say so (one answer, as fp8lab launch plan prints it)
        on_target = {m: c for m, g, c in zip(head["model"], head["gpu_name"], costs)
                     if on_instance_gpu(g, instance_type) and not c["cost_note"]}
        for (_, r), c in zip(head.iterrows(), costs):
            if r["model"] in on_target and not on_instance_gpu(r["gpu_name"], instance_type):
                c.update(on_target[r["model"]], cost_note=f"priced from its runs on the {INSTANCES[instance_type].gpu}")
        rows = head.assign(why_bf16=WHY_BF16, why_fp8=WHY_FP8)
        for col in COST_COLUMNS:
            rows[col] = [c[col] for c in costs]
        return cls(rows[ANSWER_COLUMNS], comparison, reference, float(tokens), float(price_per_instance_hour),
                   instance_type, est, price)

    @property
    def price_note(self) -> str:
        """The price these costs stand beside, with its date (fp8lab.analysis.estimates.price_words)."""
        return price_words(self.price if self.price is not None else self.price_per_instance_hour, self.instance_type)

    def verdict(self, loss_tolerance_pct: float = 1.0) -> str:
        """The verdict paragraph, written from these rows (:func:`fp8lab.analysis.verdict`)."""
        per_model, closing = self.verdict_parts(loss_tolerance_pct)
        return " ".join(per_model + closing)

    def verdict_parts(self, loss_tolerance_pct: float = 1.0) -> tuple[list[str], list[str]]:
        """The verdict's sentences (:func:`fp8lab.analysis.conclusion.verdict_parts`): (one per model, then
        the conclusion and the source's figures)."""
        return verdict_parts(self.comparison, reference=self.reference, loss_tolerance_pct=loss_tolerance_pct,
                             answer=self)

    def time_to_loss(self, runs: pd.DataFrame) -> pd.DataFrame:
        """Per model with a loss study in ``runs``: the tokens, time and cost FP8 takes to reach BF16's final
        validation loss, beside the tokens/s speed-up (:func:`fp8lab.analysis.time_to_loss.time_to_loss`)."""
        return same_loss_table(self, runs)

    def costs(self) -> pd.DataFrame:
        """The time and cost of the budget per model and precision, in the columns of
        :func:`cost_table` (so :func:`fp8lab.views.plots.cost_figure` draws it)."""
        gpus = INSTANCES[self.instance_type].gpus
        out = []
        for _, r in self.rows.iterrows():
            for prec in ("bf16", "fp8"):
                if not isinstance(r[f"{prec}_run"], str) or pd.isna(r[f"hours_{prec}"]):
                    continue
                out.append({"run_id": r[f"{prec}_run"], "model": r["model"], "precision": prec,
                            "variant": r[f"{prec}_variant"], "gpu_name": r["gpu_name"], "instances": 1,
                            "world_size": r["world_size"], "tokens_per_sec_per_gpu": r[f"tps_{prec}"],
                            "cluster_gpus": gpus, "hours": r[f"hours_{prec}"], "cost_usd": r[f"cost_{prec}"],
                            "projected": True, "token_budget": self.tokens,
                            "price_per_instance_hour": self.price_per_instance_hour, "price_note": self.price_note})
        return pd.DataFrame(out, columns=["run_id", "model", "precision", "variant", "gpu_name", "instances",
                                          "world_size", "tokens_per_sec_per_gpu", "cluster_gpus", "hours",
                                          "cost_usd", "projected", "token_budget", "price_per_instance_hour",
                                          "price_note"])

    def row(self, model: str, *, priced: bool = False) -> pd.Series:
        """``model``'s row. Measured on several GPUs: the row on :func:`main_gpu` (the README's), or with ``priced``
        the row its time and cost rest on (the instance's GPU, where the model ran there)."""
        rows = self.rows[self.rows["model"] == model]
        if not len(rows):
            raise KeyError(f"model={model!r}: not in the answer; allowed: "
                           f"{', '.join(dict.fromkeys(self.rows['model']))}")
        if priced:  # a row with a cost (a memory mode's runs price no P5 job), on the instance's GPU where one is
            rows = rows[rows["cost_fp8"].notna()] if rows["cost_fp8"].notna().any() else rows
            pick = rows[[on_instance_gpu(g, self.instance_type) for g in rows["gpu_name"]]]
        else:
            pick = rows[rows["gpu_name"] == main_gpu(self.rows, self.instance_type)]
        return (pick if len(pick) else rows).iloc[0]

    def at_scale(self, model: str, instance_counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> pd.DataFrame:
        """The budget on several instances, BF16 / FP8 / FP8 all-gather, resting on this answer's
        runs (``fp8lab.analysis.scaling.instance_table``; its one-instance hours are this answer's)."""
        row = self.row(model, priced=True)
        runs = {p: row[f"{p}_run"] for p in ("bf16", "fp8") if isinstance(row[f"{p}_run"], str)}
        return instance_table(self.estimate, model, list(instance_counts), self.tokens,
                              instance_type=self.instance_type,
                              price_per_hour=self.price_per_instance_hour, runs=runs)

    def numbers(self) -> dict[str, dict[str, float | str | None]]:
        """Per model the numbers every view quotes (for tests and notebook glue): runs, speedup, MFU,
        loss gap, hours and cost."""
        def num(v):
            return None if pd.isna(v) else float(v)

        return {str(r["model"]): {"bf16_run": r["bf16_run"], "fp8_run": r["fp8_run"], "speedup": num(r["speedup"]),
                                  "tps_bf16": num(r["tps_bf16"]), "tps_fp8": num(r["tps_fp8"]),
                                  "mfu_bf16": num(r["mfu_bf16"]), "mfu_fp8": num(r["mfu_fp8"]),
                                  "loss_gap_pct": num(r["loss_gap_pct"]),
                                  "loss_study": r["loss_study"] if isinstance(r["loss_study"], str) else None,
                                  "hours_bf16": num(r["hours_bf16"]), "hours_fp8": num(r["hours_fp8"]),
                                  "cost_bf16": num(r["cost_bf16"]), "cost_fp8": num(r["cost_fp8"])}
                for r in (self.row(m) for m in dict.fromkeys(self.rows["model"]))}


def _unpriced_shape(model: str) -> str | None:
    """Why the plan prices no job of ``model`` (None: it does): P5 plans price fp8lab's named shapes."""
    if model in MODEL_CONFIGS:
        return None
    return (f"{model} is a model folder's shape, and P5 plans price fp8lab's named shapes (plan a folder with "
            "fp8lab launch plan --models <folder>)")


def main_gpu(rows: pd.DataFrame, instance_type: str = ANSWER_INSTANCE) -> str | None:
    """The GPU whose rows the README's table and figure show, one per model: the GPU of ``instance_type`` (P5's
    H100) where any row ran on it, else the GPU most rows ran on (the first of a tie, in the rows' order); a
    model's rows on other GPUs (the H200 beside P5's H100) are in docs/results.md. None: no rows."""
    gpus = rows["gpu_name"].dropna()
    on = gpus[[on_instance_gpu(g, instance_type) for g in gpus]]
    gpus = on if len(on) else gpus
    return str(gpus.value_counts(sort=True).index[0]) if len(gpus) else None


def on_main_gpu(best: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """The runs of ``best`` (:func:`best_runs`) on :func:`main_gpu` of the answer's ``rows``: what the headline
    figure draws, in docs/headline.png and notebook 05 alike (one panel per model, as the README's table)."""
    main = main_gpu(rows)
    return best[best["gpu_name"] == main] if main else best


def _budget(est, model: str, precision: str, run: str, tokens: float, price: float, instance_type: str,
            gpus_per_instance: int | None = None) -> tuple[dict | None, str]:
    """The plan's time and cost of ``tokens`` resting on run ``run`` (``est.run_budget``), or None and why not:
    the one formula of every cost fp8lab quotes."""
    unpriced = _unpriced_shape(model)
    if unpriced:
        return None, unpriced
    job = est.run_budget(model, precision, run, tokens, price, instance_type=instance_type,
                         gpus_per_instance=gpus_per_instance)
    return job, "" if job else f"{precision} run {run} is not a one-GPU run on a GPU with a known peak"


def _costs(est, row: pd.Series, tokens: float, price: float, instance_type: str) -> dict:
    """Hours and cost of the budget for a headline row's best BF16 and best FP8 run (the plan's estimate)."""
    out: dict = {c: np.nan for c in COST_COLUMNS}
    unpriced = _unpriced_shape(row["model"])
    if unpriced:  # a user's folder (e.g. the families study)
        out["cost_note"] = f"no time or cost: {unpriced}"
        return out
    # a memory mode's runs (fp8lab.plan.memory_modes) price no P5 job: the estimate's rates are plain-mode runs
    modes = {est.run_memory(row[f"{p}_run"]) for p in ("bf16", "fp8") if isinstance(row[f"{p}_run"], str)} - {
        "plain", None}
    if modes:
        out["cost_note"] = (f"no time or cost: its runs trained with --memory {', '.join(sorted(modes))}, one GPU's "
                            "way to fit; a P5 job shards the states over its GPUs and is priced from plain-mode runs")
        return out
    missing = []
    for prec in ("bf16", "fp8"):
        run = row[f"{prec}_run"]
        job = _budget(est, row["model"], prec, run, tokens, price, instance_type)[0] if isinstance(run, str) else None
        if job is None:
            missing.append(f"{prec} run {run}" if isinstance(run, str) else f"no {prec} run")
            continue
        out[f"hours_{prec}"], out[f"cost_{prec}"] = job["hours"], job["cost_usd"]
    if missing:
        out["cost_note"] = (f"no time or cost: {', '.join(missing)} is not a one-GPU run on a GPU with a known "
                            "peak (emulated FP8 and CPU runs say nothing about speed)")
    else:
        out["saved_pct"] = 100 * (1 - out["cost_fp8"] / out["cost_bf16"])
        out["cost_note"] = ""
    return out


COST_TABLE_COLUMNS = ["run_id", "model", "precision", "variant", "gpu_name", "instances", "world_size",
                      "tokens_per_sec_per_gpu", "cluster_gpus", "hours", "cost_usd", "projected", "token_budget",
                      "price_per_instance_hour", "cost_note", "price_note"]


def cost_table(summary: pd.DataFrame, tokens: float = DEFAULT_TOKEN_BUDGET,
               price_per_instance_hour: float | str | Price | None = DEFAULT_PRICE_PER_INSTANCE_HOUR,
               gpus_per_instance: int = DEFAULT_GPUS_PER_INSTANCE,
               instance_type: str = ANSWER_INSTANCE, estimate=None) -> pd.DataFrame:
    """Time and cost to train ``tokens`` on one instance resting on each run, as the plan estimates a job
    (the formula of :class:`Answer`'s costs: the run's tokens/s/GPU, the GPU peak ratio, the measured
    two-GPU efficiency, ``gpus_per_instance`` GPUs, plus the start-up). Runs no estimate rests on
    (several GPUs, a CPU, emulated FP8, a model folder) have no time or cost and say why (``cost_note``);
    ``projected``: the run used fewer GPUs than the instance priced. ``estimate``: the MeasuredEstimate of
    ``summary`` where the caller has one (an Answer's), so it is not calibrated again. ``price_per_instance_hour``:
    as :meth:`Answer.of` takes it; each row names it with its date (``price_note``)."""
    price = price_of(instance_type, price_per_instance_hour, name="price_per_instance_hour")
    price_per_instance_hour, note = price.usd_per_hour, price_words(price, instance_type)
    check_cost_args(tokens, price_per_instance_hour, gpus_per_instance)
    est = estimate if estimate is not None else MeasuredEstimate.of_summary(summary)
    rows = []
    for r in summary.to_dict("records"):  # rows as dicts: iterrows made a Series of each, most of the time of thousands
        job, why = _budget(est, r["model"], r["precision"], r["run_id"], tokens, price_per_instance_hour,
                           instance_type, gpus_per_instance) if isinstance(r["model"], str) else (None, "no model")
        rows.append({**{k: r[k] for k in COST_TABLE_COLUMNS[:8]}, "cluster_gpus": gpus_per_instance,
                     "hours": job["hours"] if job else np.nan, "cost_usd": job["cost_usd"] if job else np.nan,
                     "projected": r["world_size"] != gpus_per_instance if pd.notna(r["world_size"]) else True,
                     "token_budget": float(tokens), "price_per_instance_hour": float(price_per_instance_hour),
                     "cost_note": "" if job else f"no time or cost: {why}", "price_note": note})
    return pd.DataFrame(rows, columns=COST_TABLE_COLUMNS)
