"""Plan a sweep's time and cost from measured throughput, not from an assumed MFU.

A SageMaker job's time is its token budget over the cluster's tokens/s. The per-GPU rate comes from
the committed results (``data/results/``): per model and precision, the fastest run on one GPU of the
job's backend and FP8 recipe, among the runs on the job's GPU where there are any (P5's H100: no projection), else
among all. What is measured and what is assumed, in order:

1. **Per-GPU rate (measured)**: that run's steady tokens/s/GPU, converted to the job's sequence length
   through the model FLOPs per token (the run's achieved FLOP/s are kept).
2. **GPU (projected)**: the run's profile (``<run>.profile.json``, or the nearest of the same model and
   precision) splits its step: GEMMs scale with the job GPU's FP8/BF16 peak over the measuring GPU's,
   the memory-bound rest with the HBM bandwidth (H200 -> P5's H100: equal peaks, 4.8 -> 3.35 TB/s, so
   x0.91-0.95 by the run's kernels; ``fp8lab.analysis.scaling.ComputeSplit``). No profile: the BF16 peak ratio.
3. **One instance, 8 GPUs (measured at 2)**: times the per-GPU efficiency of fp8lab's two-GPU runs
   (torchrun, one machine) against one GPU, the median over the runs of the same precision and layout
   (else of the same precision). Two GPUs are the only measurement past one GPU: applying it to eight
   is an assumption.
4. **Several instances (modelled)**: times the scaling model's per-GPU rate on the instances over its
   rate on one (``fp8lab.analysis.scaling``: FSDP2's traffic over EFA against the measured compute, overlap and
   overhead fitted on the two-GPU runs; ``docs/scaling.md``). ``internode_efficiency_per_doubling``
   (a number) brings back a flat factor per doubling instead, as an assumption.

Models or GPUs without measurements fall back to :class:`fp8lab.launch.Estimate` (an assumed MFU),
and the plan table says so per job. ``launch.plan_sweep`` uses :class:`MeasuredEstimate` by default.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

# the modules, not the package (whose Answer plans with these estimates)
from fp8lab.analysis.labels import fine_tune_rows, group_key, is_fp8, layout_label
from fp8lab.analysis.load import load_runs
from fp8lab.analysis import scaling
from fp8lab.analysis.index import committed_summary, is_committed_results
from fp8lab.analysis.summary import scaling_table, summarize_runs
from fp8lab.core.hardware import HBM_BANDWIDTH, INSTANCES, gpu_label, gpu_spec, on_instance_gpu, peak_bf16_flops
from fp8lab.core.prices import price_of
from fp8lab.model.models import model_flops_per_token
from fp8lab.plan import memory_modes
from fp8lab.plan.flops_estimate import Estimate

RATE_COLUMNS = ["model", "precision", "backend", "recipe", "run_id", "source", "variant", "layout", "gpu_name",
                "seq_len", "tokens_per_sec_per_gpu", "peak_tflops", "micro_batch_size", "grad_accum", "memory"]


def measurable_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Every run an estimate can rest on: one GPU of one machine with a known dense BF16 peak, BF16 or
    FP8 on FP8 hardware through fused layers; with what an estimate needs (tokens/s/GPU, sequence
    length, the GPU and its peak)."""
    s = summary[summary["tokens_per_sec_per_gpu"].notna() & (summary["world_size"].fillna(1) == 1)
                & (summary["instances"].fillna(1) == 1)]
    s = s[s["gpu_name"].map(lambda g: peak_bf16_flops(g) is not None).astype(bool)]  # a GPU with a known peak
    s = s[~fine_tune_rows(s)]  # a plan prices pretraining: a fine-tune's speed is another workload's
    if not len(s):
        return pd.DataFrame(columns=RATE_COLUMNS)
    fp8 = s["precision"].map(is_fp8)
    s = s[~fp8 | ((s["fuse"] != False) & (s["backend"] != "emulated"))]  # noqa: E712 (fuse may be missing)
    rows = [{"model": r["model"], "precision": r["precision"], "backend": r["backend"], "recipe": r["recipe"],
             "run_id": r["run_id"], "source": r["source"], "variant": r["variant"],
             "layout": layout_label(r), "gpu_name": r["gpu_name"], "seq_len": r["seq_len"],
             "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"],
             "peak_tflops": peak_bf16_flops(r["gpu_name"]) / 1e12,
             "micro_batch_size": r.get("micro_batch_size"), "grad_accum": r.get("grad_accum"),
             "memory": memory_modes.of_record(r.get("memory"))} for _, r in s.iterrows()]
    return pd.DataFrame(rows, columns=RATE_COLUMNS)


def _mode_kind(name: str) -> str:
    """:attr:`fp8lab.plan.memory_modes.Mode.kind`, or the name itself for a mode fp8lab does not know."""
    return memory_modes.get(name).kind if name in memory_modes.BY_NAME else name


def measured_rates(summary: pd.DataFrame) -> pd.DataFrame:
    """The fastest of :func:`measurable_runs` per model, precision, backend and FP8 recipe kind."""
    s = measurable_runs(summary)
    if not len(s):
        return s
    keys = [s["model"], s["precision"], s["backend"].map(group_key), s["recipe"].map(group_key), s["memory"]]
    best = [g.loc[g["tokens_per_sec_per_gpu"].idxmax()] for _, g in s.groupby(keys, sort=True)]
    return pd.DataFrame(best, columns=RATE_COLUMNS).reset_index(drop=True)


def _node_efficiencies(summary: pd.DataFrame) -> pd.DataFrame:
    """Multi-GPU runs of one machine against their one-GPU reference (``scaling_table``)."""
    sc = scaling_table(summary, by="world_size")
    return sc[(sc["run_id"] != sc["reference_run_id"]) & (sc["instances"].fillna(1) == 1)]


def _tables(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    return measurable_runs(summary), _node_efficiencies(summary)


@functools.lru_cache(maxsize=8)
def _measurements(results: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    summary = committed_summary() if is_committed_results(results) else None  # the index: no result file read
    return _tables(summarize_runs(load_runs(results)) if summary is None else summary)


@dataclass(frozen=True)
class MeasuredEstimate(Estimate):
    """Job time from measured tokens/s/GPU (see the module docstring for what is measured and what is
    assumed); :class:`Estimate`'s fields are the fallback for models without measurements."""

    results: str | None = None  # result files or folders to measure from; None: the committed data/results/
    # None: the scaling model (fp8lab.analysis.scaling); a number: that per doubling, assumed
    internode_efficiency_per_doubling: float | None = None
    # per-GPU rate of a full instance over one GPU; None: the measured two-GPU value
    node_efficiency: float | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.internode_efficiency_per_doubling is not None and not 0 < self.internode_efficiency_per_doubling <= 1:
            raise ValueError(f"internode_efficiency_per_doubling={self.internode_efficiency_per_doubling!r}: "
                             "allowed: None (the scaling model) or a number in (0, 1]")
        if self.node_efficiency is not None and not 0 < self.node_efficiency <= 1:
            raise (ValueError(f"node_efficiency={self.node_efficiency!r}: allowed: None (measured) or a number in (0, "
                              "1]"))

    @classmethod
    def of_summary(cls, summary: pd.DataFrame, **fields: Any) -> "MeasuredEstimate":
        """The estimate measured from ``summary`` (a per-run summary already made, e.g. of the runs a
        notebook shows) instead of from result files."""
        est = cls(**fields)
        object.__setattr__(est, "given_tables", _tables(summary))  # not a field: plans print fields
        object.__setattr__(est, "given_summary", summary)  # the scaling model's profiles and calibration
        return est

    def _measured(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        return getattr(self, "given_tables", None) or _measurements(self.results)

    # --- the rate of one job ---------------------------------------------------------------------
    def rate(self, model: str, precision: str, *, instance_type: str = "ml.p5.48xlarge", instance_count: int = 1,
             backend: str = "te", recipe: str = "delayed", seq_len: Any = None,
             run_id: str | None = None, fp8_all_gather: bool = False, memory: str = "plain") -> dict[str, Any] | None:
        """Per-GPU tokens/s for a job and what it rests on; None where nothing was measured.
        ``memory``: the job's memory mode; its runs are the basis (a mode is one GPU's way to fit, so its speed is not a
        sharded job's), others only where none was measured in it.
        ``run_id``: rest on that run (one of :func:`measurable_runs`) instead of the fastest match.
        ``fp8_all_gather``: FSDP2 gathers the block linears' weights in FP8 (the scaling model's traffic)."""
        key = (model, precision, instance_type, instance_count, backend, recipe, seq_len, run_id, fp8_all_gather,
               memory)
        memo = self.__dict__.setdefault("_rates", {})  # a plan asks for each job's rate several times
        if key not in memo:
            memo[key] = self._rate(*key)
        return None if memo[key] is None else dict(memo[key])

    def _rate(self, model: str, precision: str, instance_type: str, instance_count: int, backend: str, recipe: str,
              seq_len: Any, run_id: str | None, fp8_all_gather: bool, memory: str) -> dict[str, Any] | None:
        rates, effs = self._measured()
        info = INSTANCES[instance_type]
        kind = str(recipe).partition(":")[0]
        groups = self.__dict__.get("_rate_groups")
        if groups is None:  # the measured rates per (model, precision), split once: a report asks for every run's
            groups = self.__dict__["_rate_groups"] = {k: g
                                                      for k, g in rates.groupby(["model", "precision"], sort=False)}
        mine = groups.get((model, precision), rates.iloc[:0])
        if run_id is not None:  # a report asks for every run's: each group's runs found by id, not by a scan each
            ids = self.__dict__.setdefault("_rate_ids", {})
            if (model, precision) not in ids:
                ids[(model, precision)] = mine.groupby("run_id", sort=False).indices if len(mine) else {}
            pos = ids[(model, precision)].get(run_id)
            if pos is None:
                return None
            exact = mine.iloc[pos]
            if "memory" in exact and (exact["memory"] != memory).any():  # a memory mode's speed is not this job's
                return None
        elif precision == "fp8":
            exact = mine[(mine["backend"] == backend) & (mine["recipe"] == kind)]
        else:
            exact = mine[mine["backend"] == backend]
        mine = exact if len(exact) else mine
        if run_id is None and "memory" in mine:  # the job's mode, else one that keeps its states alike
            same = mine[mine["memory"] == memory]
            if not len(same):
                same = mine[mine["memory"].map(_mode_kind) == _mode_kind(memory)]
            mine = same if len(same) else mine
        if run_id is None:  # measured on the job's GPU (P5's H100) beats projected from another GPU, however fast
            here = mine[[on_instance_gpu(g, instance_type) for g in mine["gpu_name"]]]
            mine = here if len(here) else mine
        if not len(mine):
            return None
        r = mine.loc[mine["tokens_per_sec_per_gpu"].idxmax()]
        job_seq = seq_len if isinstance(seq_len, int) and not isinstance(seq_len, bool) else int(r["seq_len"])
        seq_scale = model_flops_per_token(model, int(r["seq_len"])) / model_flops_per_token(model, job_seq)
        node_eff, node_from = self._node_efficiency(effs, r)
        n = max(int(instance_count), 1)
        model = self._scaling(r, instance_type, n, fp8_all_gather)  # GPU projection and nodes
        inter = (self.internode_efficiency_per_doubling ** math.log2(n) if n > 1 else 1.0) \
            if self.internode_efficiency_per_doubling is not None else model["model_internode_efficiency"]
        per_gpu = (r["tokens_per_sec_per_gpu"] * seq_scale * model["gpu_scale"] * (node_eff if info.gpus > 1 else 1.0)
                   * inter)
        return {"tokens_per_sec_per_gpu": per_gpu, "run_id": r["run_id"], "source": r["source"],
                "measured_tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"], "variant": r["variant"],
                "layout": r["layout"], "gpu_name": r["gpu_name"], "seq_scale": seq_scale,
                "target_gpu": info.gpu, "node_efficiency": node_eff, "node_efficiency_from": node_from,
                "internode_efficiency": inter, "instances": n, "gpus_per_instance": info.gpus,
                "exact_match": bool(len(exact)), "memory": memory_modes.of_record(r.get("memory")),
                "job_memory": memory, **model}

    def _scaling(self, run: pd.Series, instance_type: str, instances: int, fp8_all_gather: bool) -> dict[str, Any]:
        """The scaling model's GPU projection and multi-node factor for a job resting on ``run``."""
        given = getattr(self, "given_summary", None)
        if given is not None and getattr(self, "given_calibration", None) is None:
            object.__setattr__(self, "given_calibration", scaling.calibrate(given))
        return scaling.project(run, instance_type, instances, fp8_all_gather=fp8_all_gather,
                               sources=self._measured()[0]["source"],
                               calibration=getattr(self, "given_calibration", None), results=self.results)

    def _node_efficiency(self, effs: pd.DataFrame, run: pd.Series) -> tuple[float, str]:
        if self.node_efficiency is not None:
            return self.node_efficiency, "given"
        key = (run["precision"], run["model"], run["layout"])
        memo = self.__dict__.setdefault("_node_effs", {})  # runs of one model, precision and layout share it
        if key not in memo:
            memo[key] = self._measured_node_efficiency(effs, run)
        return memo[key]

    @staticmethod
    def _measured_node_efficiency(effs: pd.DataFrame, run: pd.Series) -> tuple[float, str]:
        same = effs[effs["precision"] == run["precision"]]
        model = same[same["model"] == run["model"]]
        layout = model[model["variant"].str.endswith(", " + run["layout"])]
        for pick, what in ((layout, f"at {run['layout']}"), (model, "other layouts"), (same, "other models"),
                           (effs, "any precision")):
            if len(pick):
                models = "/".join(sorted(pick["model"].astype(str).unique()))
                return (float(pick["efficiency"].median()),
                        f"median of {len(pick)} two-GPU run(s) of {models} {run['precision']}, {what}")
        return 1.0, "none measured: 1.0 assumed"

    def run_memory(self, run_id: str) -> str | None:
        """The memory mode run ``run_id`` trained in (fp8lab.plan.memory_modes), None where it is no measurable run."""
        rates = self._measured()[0]
        hit = rates[rates["run_id"] == run_id]
        return str(hit["memory"].iloc[0]) if len(hit) else None

    # --- the Estimate interface launch.plan_sweep uses -----------------------------------------
    def job_rate(self, spec) -> dict[str, Any] | None:
        plan = spec.plan  # what the job runs: "auto" as its plan resolved it
        return self.rate(spec.model, spec.precision, instance_type=spec.instance_type,
                         instance_count=spec.instance_count, backend=plan.backend_label,
                         recipe=plan.recipe.kind if plan.recipe else "delayed",
                         seq_len=plan.seq_len, memory=plan.memory_mode)

    def seconds(self, spec) -> float:
        r = self.job_rate(spec)
        if r is None:
            return super().seconds(spec)
        # the start-up of seconds_at is startup_s: the job's own adds the TE build where its image needs one
        return self.seconds_at(spec.total_tokens, r["tokens_per_sec_per_gpu"], spec.world_size) + \
            self.startup(spec) - self.startup_s

    def seconds_at(self, tokens: float, tokens_per_sec_per_gpu: float, gpus: int) -> float:
        """The one formula of a job's wall time: tokens over the cluster's rate, plus the start-up."""
        return tokens / (tokens_per_sec_per_gpu * gpus) + self.startup_s

    def run_budget(self, model: str, precision: str, run_id: str, tokens: float, price_per_hour: float, *,
                   instance_type: str = "ml.p5.48xlarge", instance_count: int = 1,
                   gpus_per_instance: int | None = None) -> dict[str, Any] | None:
        """Time and cost of one job of ``tokens`` resting on the run ``run_id``, as a plan of that job
        computes them (:meth:`seconds`); None where the run is not one an estimate can rest on.
        ``gpus_per_instance``: GPUs working per instance (None: the instance type's)."""
        r = self.rate(model, precision, instance_type=instance_type, instance_count=instance_count, run_id=run_id)
        if r is None:
            return None
        gpus = (gpus_per_instance or INSTANCES[instance_type].gpus) * max(int(instance_count), 1)
        hours = self.seconds_at(tokens, r["tokens_per_sec_per_gpu"], gpus) / 3600
        return {**r, "hours": hours, "cost_usd": hours * max(int(instance_count), 1) * price_per_hour,
                "gpus": gpus, "basis": _basis_text(r)}

    def basis(self, spec) -> str:
        r = self.job_rate(spec)
        return super().basis(spec) if r is None else _basis_text(r)

    def internode_text(self) -> str:
        if self.internode_efficiency_per_doubling is not None:
            return f"{self.internode_efficiency_per_doubling:g} per doubling of instances, assumed"
        return ("the scaling model's multi-node factor (fp8lab.analysis.scaling: measured compute by kernel class, "
                "FSDP2 traffic over EFA, overlap fitted on the two-GPU runs)")

    def describe(self) -> str:
        return (f"estimate: measured tokens/s/GPU per model and precision (column basis: the run, x GPU peak "
                f"ratio, x the measured two-GPU efficiency for a full instance, x {self.internode_text()}), "
                f"+{self.startup_s} s start-up per job (+{self.te_build_s} s where a job compiles TE); models without "
                f"measurements: {Estimate.describe(self)}")


def price_words(price: Any = None, instance_type: str = "ml.p5.48xlarge", *, full: bool = False) -> str:
    """The price a cost stands beside, with its date: "$113.07/instance-hour, as of 2024-11" (``full``: with the
    instance type, region and source). ``price``: None (the assumed default), a number, "lookup" or a
    ``fp8lab.core.prices.Price``, as every view and ``fp8lab launch plan`` take it. The one place the README,
    notebooks 04 and 05, the verdict and the report get that text."""
    p = price_of(instance_type, price)
    return p.text() if full else p.short()


def _basis_text(r: dict[str, Any]) -> str:
    parts = [f"measured {r['run_id']} ({r['measured_tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, {r['layout']}, "
             f"{r['gpu_name']})"]
    if not r["exact_match"]:
        parts.append(f"nearest variant: {r['variant']}")
    if r.get("memory", "plain") != r.get("job_memory", "plain"):  # a mode's speed stands in for another's
        parts.append(f"measured in --memory {r['memory']}: no run in the job's {r['job_memory']} yet")
    if abs(r["seq_scale"] - 1) > 1e-9:
        parts.append(f"x{r['seq_scale']:.3f} for the job's sequence length")
    parts.append(f"x{r['gpu_scale']:.2f} {r['target_gpu']}/{gpu_label(r['gpu_name'])} (kernels of "
                 f"{r['gpu_split_from']}: GEMMs by FP8/BF16 peak, the rest by HBM bandwidth)")
    if r.get("gpus_per_instance", 8) > 1:  # a one-GPU instance (ml.p5.4xlarge) runs at the measured one-GPU rate
        parts.append(f"x{r['node_efficiency']:.3f} 8 GPUs/node ({r['node_efficiency_from']}, assumed for 8)")
    if r["instances"] > 1:
        parts.append(f"x{r['internode_efficiency']:.3f} {r['instances']} nodes ({_internode_words(r)})")
    return "; ".join(parts)


def gpu_words(r: dict[str, Any], gpu: str) -> str:
    """How a run's rate was carried to ``gpu`` (``fp8lab.launch.plan.plan_curve``'s column)."""
    mine, theirs = gpu_spec(HBM_BANDWIDTH, r["gpu_name"]), gpu_spec(HBM_BANDWIDTH, gpu)
    hbm = f" {mine / 1e12:g} against {theirs / 1e12:g} TB/s" if mine and theirs else ""
    return (f"measured on {r['gpu_name']}, projected to {gpu} by kernel class (the run's profile: GEMMs by the "
            f"FP8/BF16 peak ratio, other kernels by the HBM bandwidth ratio{hbm})")


def _internode_words(r: dict[str, Any]) -> str:
    if abs(r["internode_efficiency"] - r["model_internode_efficiency"]) > 1e-12:
        return "assumed per doubling"
    ag = ", FP8 all-gather" if r.get("fp8_all_gather") else ""
    return f"scaling model: FSDP2 over EFA{ag}" + (", communication-bound" if r.get("comm_bound") else "")
