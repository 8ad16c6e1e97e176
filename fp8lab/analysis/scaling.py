"""Past one node, on paper: per-GPU throughput of FSDP2 jobs on several instances.

A step's time on ``G`` GPUs is modelled as measured compute plus modelled communication:

    step = compute + overhead x micro-batches + exposed(comm),
    exposed(comm) = max((1 - overlap) x comm, comm - overlap x compute)

* **compute**: the one-GPU run's measured step (tokens per step / tokens/s), split by its profile's
  kernel categories (``<run>.profile.json``): FP8 GEMMs scale with the GPU's dense FP8 peak, BF16
  GEMMs and attention with its BF16 peak, every other kernel (casts, norms, elementwise, optimizer)
  with its HBM bandwidth, and the idle share (host work) not at all. So an H200 measurement projects to
  an H100 through the H100's 3.35 TB/s, not only its (equal) peaks.
* **comm**: FSDP2's bytes per GPU and optimizer step (:func:`traffic`): the parameter all-gather
  (BF16, or FP8 for the block linears with FP8 all-gather), once per step with kept weights, else
  twice per micro-batch; the gradient reduce-scatter in FP32 (the trainer's ``reduce_dtype``) once
  per step (accumulation skips the sync). A ring moves ``bytes x (G-1)/G`` per GPU over the slowest
  link: NVLink inside one instance, the instance's EFA share per GPU between instances.
* **calibrated** from the committed two-GPU runs (:func:`calibrate`): the link efficiency (modelled
  bytes over the profiles' NCCL kernel time, against NVLink's peak; applied to EFA too), the overlap
  and the per-micro-batch overhead (FSDP2 hooks, copies; a least-squares fit of the exposed time).

Every constant, its source and what is assumed: ``docs/scaling.md`` (the GPU and network figures
live in :mod:`fp8lab.core.hardware`). Torch-free: the launcher plans with it on any machine.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from fp8lab.analysis.index import committed_index, committed_summary, is_committed_results
from fp8lab.analysis.labels import model_size_b
from fp8lab.analysis.load import load_profiles, load_runs
from fp8lab.analysis.summary import scaling_table, summarize_runs
from fp8lab.core import hardware as hw
from fp8lab.core.paths import REPO_ROOT, RESULTS_DIR, is_inside
from fp8lab.model.models import block_matmul_params, count_parameters, get_config
from fp8lab.fp8.backends import FP8_ALL_GATHER_BACKENDS  # the trainer's: torchao's float8 FSDP2 all-gather

# kernel categories of fp8lab.train.profiling, by what they scale with on another GPU
FP8_GEMM = ("fp8 gemm",)
BF16_COMPUTE = ("gemm (bf16/fp32)", "attention")  # tensor-core bound: the BF16 peak
COMM = ("communication (nccl)",)  # not compute; one-GPU runs have none
REDUCE_BYTES = 4  # the trainer's FSDP2 MixedPrecisionPolicy(reduce_dtype=float32) (fp8lab.train.distributed.wrap)
GAIN_THRESHOLD = 1.10  # below this FP8 speedup at scale the plan calls the job communication-bound

# Two-GPU runs the calibration leaves out, and why (benchmarks/studies/two_gpus.md)
CALIBRATION_EXCLUDED: dict[str, str] = {
    "llama-1b-te-bf16-p16-2gpu-fsdp-ga4": "call 11 ran beside other work (step times wandering); call 14 repeated it",
    "llama-1b-te-fp8-delayed-p16-2gpu-fsdp-ga4": "call 11 ran beside other work (step times wandering); call 14 "
                                                 "repeated it",
    "llama-1b-te-fp8-delayed-2gpu-fsdp": "FSDP2 with fp32 parameters (fp32 all-gathers); no plan runs it",
}

# --- compute ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ComputeSplit:
    """Shares of a one-GPU step by what they scale with (they add up to 1) and the profile they come from."""

    fp8_gemm: float
    bf16: float
    memory: float
    idle: float
    profile: str  # run id of the profile, or why there is none

    def time_scale(self, from_gpu: str, to_gpu: str) -> float:
        """The step's time on ``to_gpu`` over its time on ``from_gpu`` (1.0 where a spec is unknown)."""
        def ratio(table):
            a, b = hw.gpu_spec(table, from_gpu), hw.gpu_spec(table, to_gpu)
            return a / b if a and b else 1.0
        return (self.fp8_gemm * ratio(hw.PEAK_FP8_DENSE) + self.bf16 * ratio(hw.PEAK_BF16_DENSE)
                + self.memory * ratio(hw.HBM_BANDWIDTH) + self.idle)


def compute_split(run: Mapping[str, Any], profiles: pd.DataFrame) -> ComputeSplit:
    """The split of ``run``'s step: its own profile, else one of the same model and precision (same
    layout first), else all of it BF16 tensor-core time (the peak ratio alone, as before this model)."""
    p = profiles[(profiles["model"] == run.get("model")) & (profiles["precision"] == run.get("precision"))] \
        if len(profiles) else profiles
    own = p[p["run_id"] == run.get("run_id")] if len(p) else p
    if len(own):
        p = own
    elif len(p):  # the profile of the same recipe nearest in tokens per step
        recipe = run.get("recipe")
        same = p[p["variant"].str.contains(f" {recipe} ", regex=False)] if isinstance(recipe, str) else p
        p = same if len(same) else p
        mb, ga, _ = _layout(run)
        near = {rid: (abs(math.log(_tokens_of(lay) / (mb * ga))), rid) for rid, lay in zip(p["run_id"], p["layout"])}
        p = p[p["run_id"] == min(near, key=near.get)]
    if not len(p):
        return ComputeSplit(0.0, 1.0, 0.0, 0.0, "no profile: all of the step scaled with the BF16 peak")
    ms = p.groupby("category")["ms"].sum()
    total = float(p["total_ms"].iloc[0])
    work = ms.drop([c for c in COMM if c in ms.index])
    fp8, bf16 = ms.reindex(FP8_GEMM).fillna(0).sum(), ms.reindex(BF16_COMPUTE).fillna(0).sum()
    memory = work.sum() - fp8 - bf16
    idle = max(total - work.sum(), 0.0)
    whole = fp8 + bf16 + memory + idle
    return ComputeSplit(fp8 / whole, bf16 / whole, memory / whole, idle / whole, str(p["run_id"].iloc[0]))


def _tokens_of(layout: str) -> float:
    """Sequences per step of a layout label ('2x2048, accum 16' -> 32)."""
    mb, _, rest = layout.partition("x")
    ga = rest.partition("accum ")[2]
    return float(mb or 1) * float(ga or 1)


@functools.lru_cache(maxsize=8)
def _profiles_of(sources: tuple[str, ...]) -> pd.DataFrame:
    if sources and all(s.endswith(".jsonl") and is_inside(s, RESULTS_DIR) for s in sources):
        idx = committed_index()  # committed result files: their profiles from the index (None: stale)
        if idx is not None:
            return idx.profiles_beside(list(sources))

    files = [str(Path(s).with_suffix("")) + ".profile.json" for s in sources if str(s).endswith(".jsonl")]
    files = [f for f in files if Path(f).exists()] or [s for s in sources if Path(s).is_dir()]
    return load_profiles(files) if files else load_profiles([])


def _profiles_beside(sources: Any) -> pd.DataFrame:
    """The profiles beside result files ``sources`` (paths; NaNs skipped), cached by their sorted full paths."""
    return _profiles_of(_full_paths(tuple(str(s) for s in pd.Series(sources, dtype=object).dropna())))


@functools.lru_cache(maxsize=8)
def _full_paths(sources: tuple[str, ...]) -> tuple[str, ...]:  # once per set of sources (each rate asks again)
    return tuple(sorted({_full(s) for s in sources}))


def profiles_of(summary: pd.DataFrame) -> pd.DataFrame:
    """The profiles beside the result files of a per-run summary (``<run>.profile.json``)."""
    return _profiles_beside(summary.get("source", ()))


# --- communication -----------------------------------------------------------------------------
def traffic(model: str, gpus: int, *, grad_accum: int, keep_weights: bool | None = None, parallel: str = "fsdp",
            param_bytes: int = 2, fp8_all_gather: bool = False) -> dict[str, float]:
    """Bytes each GPU moves per optimizer step: ``all_gather`` and ``reduce_scatter`` (FSDP2) or
    ``all_reduce`` (DDP), as a ring over ``gpus`` moves them (``bytes x (gpus-1)/gpus``)."""
    if gpus <= 1:
        return {}
    cfg = get_config(model)
    total = count_parameters(cfg).total
    ring = (gpus - 1) / gpus
    if parallel == "ddp":
        return {"all_reduce": 2 * total * REDUCE_BYTES * ring}
    keep = grad_accum > 1 if keep_weights is None else bool(keep_weights and grad_accum > 1)
    gathers = 1 if keep else 2 * grad_accum
    fp8_params = block_matmul_params(cfg) * cfg.num_layers if fp8_all_gather else 0
    gather = fp8_params * 1 + (total - fp8_params) * param_bytes
    return {"all_gather": gathers * gather * ring, "reduce_scatter": total * REDUCE_BYTES * ring}


def link_peak(gpu_name: str, instance_type: str | None, instances: int) -> float:
    """Peak bytes/s per GPU of the slowest link a ring crosses: NVLink in one instance, else the
    instance's EFA divided among its GPUs."""
    if instances <= 1:
        return hw.gpu_spec(hw.NVLINK_BANDWIDTH, gpu_name) or 450e9
    info = hw.INSTANCES[instance_type]
    return hw.EFA_GBPS[instance_type] * 1e9 / 8 / info.gpus


# --- calibration --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Calibration:
    """The fitted constants and the runs they were fitted on (``runs``: measured against modelled)."""

    link_efficiency: float
    overlap: float
    overhead_ms: float  # per micro-batch
    runs: pd.DataFrame = field(repr=False, compare=False, default_factory=pd.DataFrame)

    def step_ms(self, compute_ms: float, comm_ms: float, micro_batches: int) -> float:
        exposed = max((1 - self.overlap) * comm_ms, comm_ms - self.overlap * compute_ms, 0.0)
        return compute_ms + (self.overhead_ms * micro_batches if comm_ms > 0 else 0.0) + exposed

    def describe(self) -> str:
        return (f"link efficiency {self.link_efficiency:.2f} of peak, overlap {self.overlap:.2f}, "
                f"{self.overhead_ms:.1f} ms per micro-batch (fitted on {len(self.runs)} two-GPU runs)")


def _layout(r: Mapping[str, Any]) -> tuple[int, int, int]:
    def num(k, default):
        v = r.get(k)
        return int(v) if v is not None and not pd.isna(v) else default
    return num("micro_batch_size", 1), num("grad_accum", 1), num("seq_len", 2048)


def _param_bytes(r: Mapping[str, Any]) -> int:
    return 2 if r.get("param_dtype") == "bf16" else 4


def _run_traffic(r: Mapping[str, Any], gpus: int, **kw: Any) -> dict[str, float]:
    keep = r.get("fsdp_keep_weights")
    return traffic(r["model"], gpus, grad_accum=_layout(r)[1], keep_weights=bool(keep) if keep is True else False,
                   parallel=str(r.get("parallel") or "ddp"), param_bytes=_param_bytes(r), **kw)


def calibrate(summary: pd.DataFrame, profiles: pd.DataFrame | None = None) -> Calibration:
    """Fit the link efficiency, overlap and overhead to the two-GPU runs of one machine in ``summary``
    (each against its one-GPU reference, :func:`fp8lab.analysis.scaling_table`)."""
    profiles = profiles_of(summary) if profiles is None else profiles
    sc = scaling_table(summary, by="world_size")
    sc = sc[(sc["run_id"] != sc["reference_run_id"]) & (sc["world_size"] == 2) & (sc["instances"].fillna(1) == 1)
            & ~sc["run_id"].isin(list(CALIBRATION_EXCLUDED))]
    meta = summary.drop_duplicates("run_id").set_index("run_id")
    # 1. link efficiency: modelled bytes over the NCCL kernel time of the two-GPU profiles
    rates = []
    for run_id, g in profiles[profiles["category"].isin(COMM)].groupby("run_id"):
        if run_id in meta.index and run_id not in CALIBRATION_EXCLUDED and meta.loc[run_id, "world_size"] == 2:
            r = {"run_id": run_id, **meta.loc[run_id].to_dict()}
            moved = sum(_run_traffic(r, 2).values())
            peak = link_peak(r.get("gpu_name") or "H200", None, 1)
            rates.append(moved / (g["ms"].sum() / 1e3) / peak)
    link_eff = float(np.median(rates)) if rates else 1.0
    # 2. overlap and overhead: least squares of the exposed time over (comm, micro-batches)
    rows = []
    for _, s in sc.iterrows():
        r = {"run_id": s["run_id"], **meta.loc[s["run_id"]].to_dict()}
        mb, ga, seq = _layout(r)
        tokens = mb * ga * seq
        t1, t2 = tokens / s["reference_tokens_per_sec_per_gpu"] * 1e3, tokens / s["tokens_per_sec_per_gpu"] * 1e3
        comm = sum(_run_traffic(r, 2).values()) / (link_peak(r.get("gpu_name") or "H200", None, 1) * link_eff) * 1e3
        rows.append({"run_id": s["run_id"], "reference_run_id": s["reference_run_id"], "tokens_per_step": tokens,
                     "micro_batches": ga, "compute_ms": t1, "measured_ms": t2, "comm_ms": comm,
                     "measured_tokens_per_sec_per_gpu": s["tokens_per_sec_per_gpu"]})
    runs = pd.DataFrame(rows)
    if not len(runs):
        return Calibration(link_eff, 1.0, 0.0, runs)
    x = np.column_stack([runs["comm_ms"], runs["micro_batches"]])
    (a, h), *_ = np.linalg.lstsq(x, runs["measured_ms"] - runs["compute_ms"], rcond=None)
    cal = Calibration(link_eff, float(np.clip(1 - a, 0.0, 1.0)), float(max(h, 0.0)), runs)
    model_ms = [cal.step_ms(c, m, g) for c, m, g in zip(runs["compute_ms"], runs["comm_ms"], runs["micro_batches"])]
    runs["model_ms"] = model_ms
    runs["model_tokens_per_sec_per_gpu"] = runs["tokens_per_step"] / runs["model_ms"] * 1e3
    runs["error"] = runs["model_tokens_per_sec_per_gpu"] / runs["measured_tokens_per_sec_per_gpu"] - 1
    return Calibration(cal.link_efficiency, cal.overlap, cal.overhead_ms, runs)


def committed_calibration(results: str | None = None) -> Calibration:
    """:func:`calibrate` on the committed results (or ``results``); the committed ones from the results
    index (``fp8lab.analysis.index``), read once per process."""
    return _calibration(results)


@functools.lru_cache(maxsize=4)
def _calibration(results: str | None) -> Calibration:  # one cache key for committed_calibration() and (None)

    summary = committed_summary() if is_committed_results(results) else None
    return calibrate(summarize_runs(load_runs(results)) if summary is None else summary)


# --- projection ---------------------------------------------------------------------------------
def efficiency(run: Mapping[str, Any], instances: int, *, instance_type: str = "ml.p5.48xlarge",
               fp8_all_gather: bool = False, calibration: Calibration | None = None,
               split: ComputeSplit | None = None, grad_accum: int | None = None) -> dict[str, float]:
    """Per-GPU rate of FSDP2 on ``instances`` x the instance's GPUs over one GPU, for the layout of the
    one-GPU ``run`` (a summary row) projected to the instance's GPU; with the parts of the step (ms).
    ``grad_accum``: another accumulation (the same micro-batch), to see what it would change."""
    cal = calibration or committed_calibration()
    info = hw.INSTANCES[instance_type]
    mb, ga, seq = _layout(run)
    ga = grad_accum or ga
    tokens = mb * ga * seq
    scale = (split or ComputeSplit(0, 1, 0, 0, "")).time_scale(str(run.get("gpu_name")), info.gpu)
    compute = tokens / float(run["tokens_per_sec_per_gpu"]) * 1e3 * scale
    gpus = info.gpus * max(int(instances), 1)
    moved = traffic(str(run["model"]), gpus, grad_accum=ga, fp8_all_gather=fp8_all_gather)
    bw = link_peak(info.gpu, instance_type, instances) * cal.link_efficiency
    comm = sum(moved.values()) / bw * 1e3
    step = cal.step_ms(compute, comm, ga)
    return {"efficiency": compute / step, "compute_ms": compute, "comm_ms": comm, "step_ms": step,
            "exposed_ms": step - compute, "bytes_per_gpu": sum(moved.values()), "tokens_per_step": tokens,
            "comm_bound": comm > cal.overlap * compute}


def advice(model: str, gain: float, *, fp8_all_gather_possible: bool, instances: int,
           threshold: float = GAIN_THRESHOLD) -> str | None:
    """What the plan says where FP8's modelled gain over BF16 at this scale falls below ``threshold``."""
    if not math.isfinite(gain) or gain >= threshold:
        return None
    helps = ["a larger micro-batch or more gradient accumulation (more compute per all-gather and reduce-scatter)"]
    if fp8_all_gather_possible:
        helps.append("FP8 all-gather (--fp8-all-gather on: half the all-gather bytes)")
    if instances > 1:
        helps.append("fewer instances")
    return (f"{model} on {instances} instance(s): FP8's modelled gain over BF16 is {gain:.2f}x, below "
            f"{threshold:.2f}x: communication-bound (FSDP2's all-gathers and reduce-scatters do not shrink with "
            f"FP8's compute). Would help: " + "; ".join(helps) + ".")


def project(run: Mapping[str, Any], instance_type: str, instances: int, *, fp8_all_gather: bool = False,
            sources: Any = (), calibration: Calibration | None = None, results: str | None = None) -> dict[str, Any]:
    """What :class:`fp8lab.analysis.estimates.MeasuredEstimate` multiplies a measured one-GPU rate by: ``gpu_scale``
    (the step's kernels projected to the instance's GPU) and ``model_internode_efficiency`` (``instances``
    over one), with the parts of the modelled step. ``sources``: the result files whose profiles count."""
    cal = calibration if calibration is not None and len(calibration.runs) else committed_calibration(results)
    split = _split_beside(run, sources)
    info = hw.INSTANCES[instance_type]
    scale = 1 / split.time_scale(str(run.get("gpu_name")), info.gpu)
    one = efficiency(run, 1, instance_type=instance_type, fp8_all_gather=fp8_all_gather, calibration=cal, split=split)
    many = efficiency(run, instances, instance_type=instance_type, fp8_all_gather=fp8_all_gather, calibration=cal,
                      split=split) if instances > 1 else one
    return {"gpu_scale": scale, "gpu_split_from": split.profile,
            "model_internode_efficiency": many["efficiency"] / one["efficiency"],
            "comm_ms": many["comm_ms"], "compute_ms": many["compute_ms"], "exposed_ms": many["exposed_ms"],
            "comm_bound": bool(many["comm_bound"]), "fp8_all_gather": bool(fp8_all_gather),
            "calibration": cal.describe()}


_SPLITS: dict[tuple, ComputeSplit] = {}  # (the sources, what compute_split reads of a run) -> the run's split


def _split_beside(run: Mapping[str, Any], sources: Any) -> ComputeSplit:
    """``compute_split(run, _profiles_beside(sources))``, made once per set of sources and per the run fields it
    reads: a cost table or a plan asks for the same run's split many times (10 ms of pandas each)."""
    key = (tuple(str(s) for s in (sources if sources is not None else ())), run.get("model"), run.get("precision"),
           run.get("run_id"), run.get("recipe"), _layout(run))
    if key not in _SPLITS:
        if len(_SPLITS) > 4096:
            _SPLITS.clear()
        _SPLITS[key] = compute_split(run, _profiles_beside(sources))
    return _SPLITS[key]


def _full(source: Any) -> str:
    path = Path(str(source))
    return str(path if path.is_absolute() else REPO_ROOT / path)


def instance_table(estimate: Any, model: str, instance_counts: list[int], tokens: float, *,
                   instance_type: str = "ml.p5.48xlarge", price_per_hour: float, backend: str = "te",
                   recipe: str = "delayed", threshold: float = GAIN_THRESHOLD,
                   runs: Mapping[str, str] | None = None, memory: Mapping[int, str] | None = None) -> pd.DataFrame:
    """Per instance count: per-GPU rate, hours and cost of BF16, FP8 and FP8 with FP8 all-gather (priced for
    the torchao backend only, where the trainer can run it; on ``backend`` the row says so), FP8's gain,
    and what would help where the gain falls below ``threshold``. ``estimate``: a MeasuredEstimate;
    ``runs``: precision -> the run id to rest on (the Answer's chosen runs) instead of the fastest;
    ``memory``: instance count -> the jobs' memory mode (plain where not given), whose runs the rate rests on."""
    rows = []
    gpus = hw.INSTANCES[instance_type].gpus
    for n in instance_counts:
        per, mine = {}, []
        for mode, prec, ag in (("bf16", "bf16", False), ("fp8", "fp8", False), ("fp8 + fp8 all-gather", "fp8", True)):
            r = estimate.rate(model, prec, instance_type=instance_type, instance_count=n, backend=backend,
                              recipe=recipe, fp8_all_gather=ag, run_id=(runs or {}).get(prec),
                              memory=(memory or {}).get(n, "plain"))
            if r is None:
                continue
            per[mode] = r["tokens_per_sec_per_gpu"]
            hours = estimate.seconds_at(tokens, r["tokens_per_sec_per_gpu"], gpus * n) / 3600
            mine.append({"model": model, "instances": n, "gpus": gpus * n, "mode": mode,
                         "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"], "hours": hours,
                         "cost_usd": hours * n * price_per_hour, "internode_efficiency": r["internode_efficiency"],
                         "comm_bound": r.get("comm_bound", False), "run_id": r["run_id"],
                         "note": "" if not ag or backend in FP8_ALL_GATHER_BACKENDS else
                         f"backend {backend} has no FP8 all-gather in fp8lab: --backend torchao"})
        for row in mine:
            row["fp8_gain"] = row["tokens_per_sec_per_gpu"] / per["bf16"] if "bf16" in per else float("nan")
            row["advice"] = advice(model, row["fp8_gain"], fp8_all_gather_possible=row["mode"] == "fp8",
                                   instances=n, threshold=threshold) if row["mode"] != "bf16" else None
        rows += mine
    return pd.DataFrame(rows)


def plan_lines(plan: Any) -> str:
    """The scaling section of ``fp8lab launch plan``: per model, per instance count, tokens/s/GPU, hours and
    cost of BF16, FP8 and FP8 with FP8 all-gather, FP8's gain, and where it falls below the threshold what
    would help. Empty where the plan's estimate is not measured (MeasuredEstimate) or the jobs count steps."""
    est = plan.estimate
    if not hasattr(est, "rate") or not plan.jobs or any(j.spec.tokens is None for j in plan.jobs):
        return ""
    first = plan.jobs[0].spec
    counts = sorted({j.spec.instance_count for j in plan.jobs})
    out = [f"scaling model (fp8lab.analysis.scaling; {committed_calibration().describe()}); "
           "tokens/s/GPU | hours | USD:"]
    for model in dict.fromkeys(j.spec.model for j in plan.jobs):
        backend = first.plan.backend_label
        modes = {j.spec.instance_count: j.spec.plan.memory_mode for j in plan.jobs if j.spec.model == model}
        t = instance_table(est, model, counts, float(first.tokens), instance_type=first.instance_type,
                           price_per_hour=plan.price_per_hour, backend=backend,
                           recipe=first.plan.recipe.kind if first.plan.recipe else "delayed", memory=modes)
        if not len(t):
            continue
        for n, g in t.groupby("instances"):
            cells = [f"{r.mode} {r.tokens_per_sec_per_gpu:,.0f} | {r.hours:.1f} h | {r.cost_usd:,.0f}"
                     + (f" ({r.fp8_gain:.2f}x)" if r.mode != "bf16" else "") for r in g.itertuples()]
            out.append(f"  {model} x{n}: " + "; ".join(cells))
        notes = sorted({a for a in t["advice"].dropna()} | {x for x in t["note"] if x})
        out += [f"  {x}" for x in notes]
    return "\n".join(out)


def answer_at_scale(answer: Any, instance_counts: tuple[int, ...] = (1, 2, 4, 8, 16), most: int = 2) -> pd.DataFrame:
    """:meth:`fp8lab.analysis.Answer.at_scale` of the answer's priced models, the source's sizes (1B, 7B)
    first, at most ``most`` of them (a readable figure: three lines per model)."""
    priced = list(dict.fromkeys(m for m, h in zip(answer.rows["model"], answer.rows["hours_fp8"]) if not pd.isna(h)))
    priced.sort(key=lambda m: (model_size_b(m) not in (1.0, 7.0), model_size_b(m) or 0))
    tables = [answer.at_scale(m, instance_counts) for m in priced[:most]]
    return pd.concat(tables, ignore_index=True) if tables else pd.DataFrame()
