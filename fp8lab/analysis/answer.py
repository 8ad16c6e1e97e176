"""The answer, computed once from the runs: per model the BF16 and FP8 runs it rests on (and why),
speedup, MFU, the loss gap and the study it comes from, and the time and cost of a token budget.

Every view renders this one object: the README's results block and ``docs/results.md``
(``fp8lab report --docs``), the HTML report, notebook 05's headline, verdict and cost chart. The
time and cost come from the estimate that plans P5 jobs (:class:`fp8lab.estimates.MeasuredEstimate`,
what ``fp8lab launch plan`` and notebook 04 print), resting on the chosen runs: one formula.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp8lab.analysis.conclusion import verdict
from fp8lab.analysis.headline import HEADLINE_COLUMNS, headline_table
from fp8lab.analysis.summary import DEFAULT_PRICE_PER_INSTANCE_HOUR, DEFAULT_TOKEN_BUDGET, compare_precisions

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

    @classmethod
    def of(cls, summary: pd.DataFrame, comparison: pd.DataFrame | None = None,
           reference: pd.DataFrame | None = None, tokens: float = DEFAULT_TOKEN_BUDGET,
           price_per_instance_hour: float = DEFAULT_PRICE_PER_INSTANCE_HOUR,
           instance_type: str = ANSWER_INSTANCE) -> "Answer":
        """The answer of a per-run summary (:func:`summarize_runs`); costs on one ``instance_type``."""
        from fp8lab.estimates import MeasuredEstimate  # estimates builds on analysis, not the other way round

        comparison = compare_precisions(summary) if comparison is None else comparison
        head = headline_table(summary, comparison, reference)
        est = MeasuredEstimate.of_summary(summary)
        costs = [_costs(est, r, tokens, price_per_instance_hour, instance_type) for _, r in head.iterrows()]
        rows = head.assign(why_bf16=WHY_BF16, why_fp8=WHY_FP8)
        for col in COST_COLUMNS:
            rows[col] = [c[col] for c in costs]
        return cls(rows[ANSWER_COLUMNS], comparison, reference, float(tokens), float(price_per_instance_hour),
                   instance_type, est)

    def verdict(self, loss_tolerance_pct: float = 1.0) -> str:
        """The verdict paragraph, written from these rows (:func:`fp8lab.analysis.verdict`)."""
        from fp8lab.hardware import INSTANCES

        return verdict(self.comparison, self.tokens, self.price_per_instance_hour, INSTANCES[self.instance_type].gpus,
                       reference=self.reference, loss_tolerance_pct=loss_tolerance_pct, answer=self)

    def costs(self) -> pd.DataFrame:
        """The time and cost of the budget per model and precision, in the columns of
        :func:`fp8lab.analysis.cost_table` (so :func:`fp8lab.plots.cost_figure` draws it)."""
        from fp8lab.hardware import INSTANCES

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
                            "price_per_instance_hour": self.price_per_instance_hour})
        return pd.DataFrame(out, columns=["run_id", "model", "precision", "variant", "gpu_name", "instances",
                                          "world_size", "tokens_per_sec_per_gpu", "cluster_gpus", "hours",
                                          "cost_usd", "projected", "token_budget", "price_per_instance_hour"])

    def at_scale(self, model: str, instance_counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> pd.DataFrame:
        """Issue 32: the budget on several instances, BF16 / FP8 / FP8 all-gather, resting on this answer's
        runs (``fp8lab.scaling.instance_table``; its one-instance hours are this answer's)."""
        from fp8lab.scaling import instance_table

        row = self.rows.set_index("model").loc[model]
        runs = {p: row[f"{p}_run"] for p in ("bf16", "fp8") if isinstance(row[f"{p}_run"], str)}
        return instance_table(self.estimate, model, list(instance_counts), self.tokens, instance_type=self.instance_type,
                              price_per_hour=self.price_per_instance_hour, runs=runs)

    def numbers(self) -> dict[str, dict[str, float | str | None]]:
        """Per model the numbers every view quotes (for tests and notebook glue): runs, speedup, MFU,
        loss gap, hours and cost."""
        def num(v):
            return None if pd.isna(v) else float(v)

        return {str(r["model"]): {"bf16_run": r["bf16_run"], "fp8_run": r["fp8_run"], "speedup": num(r["speedup"]),
                                  "tps_bf16": num(r["tps_bf16"]), "tps_fp8": num(r["tps_fp8"]),
                                  "mfu_bf16": num(r["mfu_bf16"]), "mfu_fp8": num(r["mfu_fp8"]),
                                  "loss_gap_pct": num(r["loss_gap_pct"]), "loss_study": r["loss_study"] if isinstance(r["loss_study"], str) else None,
                                  "hours_bf16": num(r["hours_bf16"]), "hours_fp8": num(r["hours_fp8"]),
                                  "cost_bf16": num(r["cost_bf16"]), "cost_fp8": num(r["cost_fp8"])}
                for _, r in self.rows.iterrows()}


def _costs(est, row: pd.Series, tokens: float, price: float, instance_type: str) -> dict:
    """Hours and cost of the budget for a headline row's best BF16 and best FP8 run (the plan's estimate)."""
    from fp8lab.models import MODEL_CONFIGS

    out: dict = {c: np.nan for c in COST_COLUMNS}
    if row["model"] not in MODEL_CONFIGS:  # a user's folder (e.g. the families study): the plan prices named shapes
        out["cost_note"] = (f"no time or cost: {row['model']} is a model folder's shape, and P5 plans price "
                            "fp8lab's named shapes (plan a folder with fp8lab launch plan --models <folder>)")
        return out
    missing = []
    for prec in ("bf16", "fp8"):
        run = row[f"{prec}_run"]
        job = est.run_budget(row["model"], prec, run, tokens, price, instance_type=instance_type) \
            if isinstance(run, str) else None
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
