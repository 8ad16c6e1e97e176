"""Plans: a sweep's jobs (``plan_sweep``) with their names, time limits, time and cost estimates.

``Estimate`` is the planning assumption (model FLOPs at an assumed MFU); plans use
``fp8lab.analysis.estimates.MeasuredEstimate`` (measured throughput) by default. ``format_cost_table``
is the plan as text.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from fp8lab.core.hardware import INSTANCES, PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE
from fp8lab.core.prices import Price, price_of
from fp8lab.plan.flops_estimate import Estimate
from fp8lab.launch.limits import runtime_problem
from fp8lab.launch.spec import MAX_RUNTIME_CAP_S, JobSpec, job_name
from fp8lab.launch.image import te_in_job

if TYPE_CHECKING:
    import pandas as pd


def default_estimate() -> Estimate:
    """The estimate plans use unless given one: measured throughput from data/results/ where it exists
    (:class:`fp8lab.analysis.estimates.MeasuredEstimate`), this MFU assumption elsewhere."""
    from fp8lab.analysis.estimates import MeasuredEstimate  # pandas: off `fp8lab launch`'s and JobSpec's import path

    return MeasuredEstimate()


@dataclass(frozen=True)
class PlannedJob:
    spec: JobSpec
    name: str
    est_hours: float  # wall clock of one job
    gpu_hours: float
    cost_usd: float


@dataclass(frozen=True)
class SweepPlan:
    """The jobs of a sweep with their names and estimates; ``table()`` for display, ``summary()`` for tests."""

    jobs: tuple[PlannedJob, ...]
    price_per_hour: float
    price_source: str
    estimate: Estimate
    price: Price | None = None  # the price with its date (price_source is its text)

    @property
    def total_cost_usd(self) -> float:
        return sum(j.cost_usd for j in self.jobs)

    @property
    def total_gpu_hours(self) -> float:
        return sum(j.gpu_hours for j in self.jobs)

    @property
    def names(self) -> list[str]:
        return [j.name for j in self.jobs]

    def table(self):
        """One row per job plus a total row, as a pandas DataFrame."""
        import pandas as pd

        rows = [{
            "job": j.name, "model": j.spec.model_label, "precision": j.spec.precision,
            "instances": j.spec.instance_count, "gpus": j.spec.world_size,
            "tokens": j.spec.total_tokens,
            # the layout the trainer will run (fp8lab.plan.layout for the instance's GPU), with its memory estimate
            "layout": f"{j.spec.layout.micro_batch_size} x {j.spec.layout.seq_len} x {j.spec.layout.grad_accum}",
            "mem_est_gib": round(j.spec.layout.memory.peak, 1),
            "max_run_h": round(j.spec.max_run_s / 3600, 2), "est_hours": round(j.est_hours, 2),
            "gpu_hours": round(j.gpu_hours, 1),
            "cost_usd": round(j.cost_usd, 2), "basis": self.estimate.basis(j.spec),
        } for j in self.jobs]
        rows.append({"job": "TOTAL", "instances": sum(j.spec.instance_count for j in self.jobs),
                     "gpus": sum(j.spec.world_size for j in self.jobs),
                     "tokens": sum(j.spec.total_tokens for j in self.jobs),
                     "gpu_hours": round(self.total_gpu_hours, 1), "cost_usd": round(self.total_cost_usd, 2)})
        df = pd.DataFrame(rows)
        for col in ("instances", "tokens"):
            df[col] = df[col].astype("Int64")
        return df

    def summary(self) -> dict[str, Any]:
        return {
            "n_jobs": len(self.jobs), "names": self.names,
            "total_gpu_hours": round(self.total_gpu_hours, 3), "total_cost_usd": round(self.total_cost_usd, 2),
            "price_per_hour": self.price_per_hour, "price_source": self.price_source,
            "price_as_of": self.price.as_of if self.price else None,
            "assumptions": dataclasses.asdict(self.estimate),
            "transformer_engine": self.te_lines(),
        }

    def te_lines(self) -> list[str]:
        """The training image and the Transformer Engine each job gets (fp8lab.launch.image), once each."""
        return sorted({te_in_job(j.spec) for j in self.jobs})


def _max_run(seconds: float) -> int:
    """Time limit from an estimate: twice the estimate plus an hour, within SageMaker's 28 days."""
    return int(min(MAX_RUNTIME_CAP_S, math.ceil(2 * seconds + 3600)))


def plan_job(spec: JobSpec, price: float, est: Estimate, seconds: float | None = None) -> PlannedJob:
    """One job of a plan: its name, time limit (from ``est`` unless the spec sets one), time and cost.
    ``seconds``: ``est.seconds(spec)`` where the caller has it already."""
    seconds = est.seconds(spec) if seconds is None else seconds
    where = f"{spec.model_label} {spec.precision} on {spec.instance_count} x {spec.instance_type}"
    amount, unit = (spec.tokens, "tokens") if spec.tokens is not None else (spec.steps, "steps")
    if (line := runtime_problem(seconds, amount, unit, where)) is not None:
        raise ValueError(line)  # a job SageMaker would stop before it ends
    if spec.max_run_s is None:
        spec = spec.with_time_limit(_max_run(seconds))
    hours = seconds / 3600
    return PlannedJob(spec, job_name(spec), hours, hours * spec.world_size, hours * spec.instance_count * price)


def plan_sweep(models: Sequence[str], precisions: Sequence[str], instance_counts: Sequence[int], *,
               price_per_hour: float | str | Price | None = None, estimate: Estimate | None = None,
               **common: Any) -> SweepPlan:
    """Every model x precision x instance count as a validated JobSpec with name, time and cost.

    ``price_per_hour``: None (the assumed default, dated), a number, ``"lookup"`` (the AWS Price List API) or a
    ``Price`` (fp8lab.core.prices.price_of).

    ``common`` are JobSpec fields shared by all jobs (tokens or steps, role, bucket, ...), so BF16
    and FP8 runs differ only in precision. Order is deterministic (models, then precisions, then counts).
    """
    for pname, values in (("models", models), ("precisions", precisions), ("instance_counts", instance_counts)):
        if isinstance(values, (str, int)) or not list(values):
            raise ValueError(f"plan_sweep({pname}=...) needs a non-empty list, got {values!r}")
        if len(set(values)) != len(list(values)):
            raise ValueError(f"plan_sweep({pname}={list(values)!r}) has duplicates")
    fields = {f.name for f in dataclasses.fields(JobSpec)}
    bad = sorted((set(common) - fields) | (set(common) & {"model", "precision", "instance_count"}))
    if bad:
        raise ValueError(f"plan_sweep: unknown or reserved JobSpec field(s) {', '.join(bad)}")
    specs = [JobSpec(model=m, precision=p, instance_count=n, **common)
             for m, p, n in itertools.product(models, precisions, instance_counts)]
    price = price_of([s.instance_type for s in specs], price_per_hour, region=specs[0].region)
    est = estimate or default_estimate()
    seconds = [est.seconds(s) for s in specs]  # the time limit does not enter the estimate
    if "max_run_s" not in common:
        # One time limit per (model, instance count), the longer of its BF16 and FP8 estimates,
        # so the paired jobs differ in nothing but precision.
        longest: dict[tuple, float] = {}
        for s, sec in zip(specs, seconds):
            key = (s.model, s.instance_count)
            longest[key] = max(longest.get(key, 0.0), sec)
        specs = [s.with_time_limit(_max_run(longest[s.model, s.instance_count])) for s in specs]  # planned once
    jobs = tuple(plan_job(s, price.usd_per_hour, est, sec) for s, sec in zip(specs, seconds))
    names = [j.name for j in jobs]
    if len(set(names)) != len(names):  # cannot happen with distinct inputs; guard the invariant
        raise ValueError(f"plan_sweep produced duplicate job names: {names}")
    return SweepPlan(jobs, price.usd_per_hour, price.text(), est, price)


def as_plan(spec_or_plan: JobSpec | SweepPlan | Sequence[JobSpec], price_per_hour: float | None = None) -> SweepPlan:
    """A plan as given, or one planned from a JobSpec or a list of them (the default estimate)."""
    if isinstance(spec_or_plan, SweepPlan):
        return spec_or_plan
    specs = [spec_or_plan] if isinstance(spec_or_plan, JobSpec) else list(spec_or_plan)
    if not specs or not all(isinstance(s, JobSpec) for s in specs):
        raise ValueError("launch() takes a JobSpec, a list of JobSpecs or a SweepPlan from plan_sweep()")
    try:
        price = price_of([s.instance_type for s in specs], price_per_hour, region=specs[0].region)
    except ValueError:
        if price_per_hour is not None:  # asked for (a number or a lookup) and refused: say so
            raise
        price = Price(float("nan"), "unknown", "no price known for this instance type (pass price_per_hour)")
    est = default_estimate()
    return SweepPlan(tuple(plan_job(s, price.usd_per_hour, est) for s in specs), price.usd_per_hour, price.text(),
                     est, price)


def format_cost_table(plan: SweepPlan) -> str:
    """The plan as text: one line per job and the total, with the price assumption spelled out."""
    df = plan.table()
    text = df.drop(columns="basis").to_string(index=False, na_rep="")
    basis = "\n".join(f"  {j.spec.model_label} {j.spec.precision} x{j.spec.instance_count}: "
                      f"{plan.estimate.basis(j.spec)}"
                      for j in plan.jobs)
    return (f"{text}\nprice: {plan.price_source}\n"
            f"{plan.estimate.describe()}\nwhat each estimate rests on:\n{basis}\n"
            f"image and Transformer Engine: {'; '.join(plan.te_lines())}" + _scaling_section(plan))


def _scaling_section(plan: SweepPlan) -> str:
    """The scaling model's per-instance-count BF16 / FP8 / FP8 all-gather lines (fp8lab.analysis.scaling)."""
    from fp8lab.analysis.scaling import plan_lines  # pandas, as above

    lines = plan_lines(plan)
    return "\n" + lines if lines else ""


def plan_curve(models: Sequence[str], precisions: Sequence[str], instance_counts: Sequence[int], tokens: int, *,
               instance_type: str = "ml.p5.48xlarge", price_per_hour: float | str | Price | None = None,
               estimate: Estimate | None = None, backend: str = "te", recipe: str = "delayed",
               seq_len: int | None = None) -> "pd.DataFrame":
    """Time and cost to train ``tokens`` per model, precision and instance count, as ``plan_sweep``
    estimates them (no job is built, so any instance count works): one row each, with the per-GPU rate,
    whether it was measured, the run it rests on and the assumption as a sentence (for the figure)."""
    # pandas (and the measured estimate, which reads results) stay off `fp8lab launch`'s import path
    import pandas as pd

    from fp8lab.analysis.estimates import MeasuredEstimate, gpu_words  # pandas, as above
    if not (isinstance(tokens, (int, float)) and tokens > 0):
        raise ValueError(f"tokens={tokens!r}; allowed: a number > 0")
    if instance_type not in INSTANCES:
        raise ValueError(f"instance_type={instance_type!r}; allowed: {', '.join(INSTANCES)}")
    bad = [n for n in instance_counts if isinstance(n, bool) or not isinstance(n, int) or n < 1]
    if bad or not list(instance_counts):
        raise ValueError(f"instance_counts={list(instance_counts)!r}; allowed: integers >= 1")
    priced = price_of([instance_type], price_per_hour)
    price = priced.usd_per_hour
    est = estimate or MeasuredEstimate()
    info = INSTANCES[instance_type]

    rows = []
    for model in models:
        for prec in precisions:
            for n in sorted(instance_counts):
                # the job plan_sweep would plan (placeholders for the account: nothing is launched)
                spec = JobSpec(model=model, precision=prec, instance_type=instance_type, instance_count=n,
                               backend=backend, recipe=recipe, seq_len="auto" if seq_len is None else seq_len,
                               tokens=int(tokens), role=PLACEHOLDER_ROLE, bucket=PLACEHOLDER_BUCKET, allow_large=True)
                # the rate and the hours both from the job's plan (its backend, recipe and sequence length)
                r = est.job_rate(spec) if isinstance(est, MeasuredEstimate) else None
                seconds = est.seconds(spec)
                hours = seconds / 3600
                if isinstance(est, MeasuredEstimate):
                    assumption = ("per-GPU rate: fastest one-GPU run in data/results (x GPU projection by kernel "
                                  "class) x the two-GPU efficiency measured on one machine (the only measurement past "
                                  f"one GPU; assumed for 8); more instances: x {est.internode_text()}")
                else:
                    assumption = est.describe()
                rows.append({"model": model, "precision": prec, "instances": n, "gpus": n * info.gpus,
                             "instance_type": instance_type, "tokens": float(tokens),
                             "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"] if r else float("nan"),
                             "hours": hours, "cost_usd": hours * n * price, "price_per_hour": price,
                             "price_note": priced.short(),
                             "measured": r is not None, "run_id": r["run_id"] if r else None,
                             "node_efficiency": r["node_efficiency"] if r else float("nan"),
                             "gpu_scaling": gpu_words(r, info.gpu) if r else None,
                             "basis": est.basis(spec), "assumption": assumption})
    return pd.DataFrame(rows)
