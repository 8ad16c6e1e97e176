"""FP8 health during training: per layer and tensor kind, how each FP8 cast went.

Every ``--fp8-stats-every`` K steps (the first micro-batch of the step) each FP8 GEMM's three
operands are looked at as they are cast: the activation (the GEMM input), the weight and the output
gradient. For each: ``amax`` (largest magnitude), ``scale`` (the scale the cast used: delayed
scaling's, from the amax history of earlier steps; current scaling's, from the tensor's own amax;
None for the block recipes, one scale per block), ``underflow`` (the fraction of the tensor's values
that are non-zero but become 0 in FP8) and ``saturation`` (the fraction that reach the format's
max and are clipped there). One ``{"record": "fp8_stats", "step": ...}`` line in metrics.jsonl.

Where the numbers come from:

* ``--backend emulated``: the emulator's own quantizers report each cast (exact: underflow is
  counted on the quantized tensor itself).
* ``--backend te``: hooks on Transformer Engine's fused modules (LayerNormLinear, Linear,
  LayerNormMLP) see the input (normalised again here with the module's own norm weight, as TE does
  before its GEMM), the weights and the output gradient; the scale is TE's ``fp8_meta`` one under
  delayed scaling and ``max / amax`` under current scaling. Inside LayerNormMLP only fc1's input
  and fc2's output gradient are visible (fc2's input and fc1's gradient stay inside TE's kernel).
  That is ``--fp8-stats-source fp8lab``.
* ``--fp8-stats-source te-debug`` (auto's choice on TE, one process, only where nvdlfw-inspect is installed and the
  committed GPU check ``TE_DEBUG_CHECK`` passed; on TE 2.20.2 it failed on cost, 18.7 s a sample at llama-1b):
  TE's own debug API (LogFp8TensorStats, LogTensorStats) sees every GEMM of the fused modules, fc2's input and
  fc1's gradient included, summed over the sampled step's micro-batches (fp8lab.fp8.te_debug).

Off (decided once by fp8lab.plan.runplan, with the reason) for BF16 runs, under CUDA graphs (a replayed graph runs no
Python hooks) and under ``--compile`` (the hooks' state would recompile the blocks at each sample).

:class:`Watch` turns the records into an early warning: a layer whose saturation or underflow is
past its threshold for ``WARN_SAMPLES`` samples in a row is named once, with the remedies fp8lab has.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Iterable

from fp8lab.core.paths import REPO_ROOT, RESULTS_DIR, read_check, read_result_text
from fp8lab.records import metrics as fmetrics

RECORD = "fp8_stats"  # metrics.jsonl record type (step records carry no "record" key)
# --fp8-stats-source: who reads the casts on TE (decided once by fp8lab.plan.runplan.fp8_stats_decision). te-debug: TE's
# own debug API (nvdlfw-inspect; fp8lab.fp8.te_debug), every GEMM of the fused layers, all micro-batches of
# the sampled step; fp8lab: this module's hooks on TE's modules (the emulated backend: always its own quantizers)
TE_DEBUG, OWN = "te-debug", "fp8lab"
SOURCES = ("auto", TE_DEBUG, OWN)
COST_GOAL_PCT = 2.0  # what the statistics may cost at the default interval, in % of the mean step time


# auto picks TE's debug API only once its GPU check is committed and passed (benchmarks/fp8stats_overhead.py --check:
# on an H200, llama-1b FP8 at the default layout, every sampled step recorded, and its cost at the default interval
# <= COST_GOAL_PCT); otherwise --fp8-stats-source te-debug runs it on request. The committed check (H200, TE 2.20.2)
# recorded every GEMM but failed on cost: a sample added 18.7 s to a 1.28 s step (the hooks: 0.29 s)
TE_DEBUG_CHECK = RESULTS_DIR / "fp8stats-sources" / "check.json"


def te_debug_checked(path=None) -> bool:
    return (read_check(TE_DEBUG_CHECK if path is None else path) or {}).get("passed") is True


TE_DEBUG_CHECKED = te_debug_checked()
# why a committed check did not pass (its "problems"); empty when it passed or none is committed
TE_DEBUG_CHECK_PROBLEMS = [str(p) for p in (read_check(TE_DEBUG_CHECK) or {}).get("problems") or []]
# the Transformer Engine the check ran on: auto trusts it on that TE (major.minor) only (fp8lab.fp8.te_debug.untested_te)
TE_DEBUG_CHECKED_TE = (read_check(TE_DEBUG_CHECK) or {}).get("transformer_engine")
KINDS = {"x": "activation", "w": "weight", "g": "gradient"}
# --fp8-stats-every auto, per backend. On TE a sampled step's statistics cost about one micro-batch's forward and
# backward (a few elementwise passes per GEMM operand), whatever the accumulation: on the H200, llama-1b FP8, +0.31 s
# on 1.27 s steps of 4 micro-batches (data/results/fp8stats-overhead/: every 10 steps 2.4% of the mean step
# time, every 25 steps 1.4%) and +0.30 s (delayed) / +0.42 s (current) on 0.34 s steps of one micro-batch (the
# sampled steps of data/results/loss-parity-20m/). So auto samples every 25 steps at 4+ micro-batches a step and
# proportionally less often below (100 at one micro-batch): about 1% of step time, by the measured per-sample
# cost (0.32 s); the mean step time of the every-25 run was 1.40% above the off run's (the goal: <= 2%).
# The emulated backend (CPU teaching runs of a few dozen steps, never timed) keeps 10, enough for a heatmap.
DEFAULT_EVERY = {"te": 25, "emulated": 10}
TE_MEASURED_ACCUM = 4  # the accumulation DEFAULT_EVERY["te"] was measured at


def default_every(backend: str, grad_accum: int) -> int:
    """``--fp8-stats-every auto``: the sampling interval for ``backend`` at ``grad_accum`` micro-batches a step (the
    same for both TE sources: TE's debug API's own cost at it is what its GPU check measures)."""
    if backend != "te":
        return DEFAULT_EVERY[backend]
    return DEFAULT_EVERY["te"] * -(-TE_MEASURED_ACCUM // max(int(grad_accum), 1))


DEFAULT_EVERY_TEXT = (f"te every {DEFAULT_EVERY['te']} steps at {TE_MEASURED_ACCUM}+ micro-batches a step, proportionally "
                      f"less often below (a sample costs about one micro-batch; every 25 steps measured +1.40% of the mean step time), "
                      f"emulated every {DEFAULT_EVERY['emulated']}")
SATURATION_WARN = 1e-3  # 0.1% of a tensor's values clipped at the format's max
UNDERFLOW_WARN = 0.25  # a quarter of the non-zero values flushed to 0
WARN_SAMPLES = 3  # that many samples in a row before the run warns
REMEDIES = ("--recipe current (each tensor scaled from its own amax: nothing clips)",
            "--recipe delayed:amax_history_len=16 (a short history: a spike stops shrinking the scale sooner)",
            "--bf16-edge-blocks 1 (the first and last decoder blocks in BF16)")

_ACTIVE: "HealthStats | None" = None  # the collector of the step being sampled (a global: backward may run on another thread)


def watching() -> bool:
    return _ACTIVE is not None


def observe(site: str | None, role: str, t, fmt, scale, quantized=None) -> None:
    """Record one FP8 cast of tensor ``t`` (``role`` x/w/g) at GEMM ``site`` while a step is sampled."""
    if _ACTIVE is not None and site is not None:
        _ACTIVE.add(site, role, t, fmt, scale, quantized)


def tensor_stats(t, fmt, scale, quantized=None):
    """[amax, underflow fraction, saturation fraction, scale] of ``t`` cast to ``fmt`` with ``scale`` (a 1-D
    tensor on t's device: no host sync). ``quantized`` given: underflow is counted on it (exact);
    saturation needs a per-tensor scale (NaN without one, as the scale)."""
    import torch

    a = t.detach().float().abs()
    nonzero = a > 0
    if quantized is not None:
        under = nonzero & (quantized.detach() == 0)
    else:  # values below half the smallest subnormal round to 0 (round to nearest even)
        under = nonzero & (a * scale <= fmt.min_subnormal / 2)
    sat = (a * scale >= fmt.max) if scale is not None else None
    n = max(a.numel(), 1)
    amax = a.max() if a.numel() else a.new_zeros(())
    nan = a.new_tensor(float("nan"))
    return torch.stack([amax, under.sum() / n, sat.sum() / n if sat is not None else nan,
                        torch.as_tensor(scale, dtype=torch.float32, device=a.device).reshape(()) if scale is not None else nan])


def row(layer: str, kind: str, fmt: str, amax, scale, underflow, saturation) -> dict[str, Any]:
    """One GEMM operand's line of an ``fp8_stats`` record, whichever source read it (None: not applicable)."""
    return {"layer": layer, "kind": kind, "format": fmt, "amax": amax, "scale": scale, "underflow": underflow,
            "saturation": saturation}


class HealthStats:
    """Collects one record every ``every`` steps; the backends report casts through :func:`observe`."""

    def __init__(self, every: int):
        self.every = every
        self._rows: list[tuple[str, str, str, Any]] = []
        self._seen: set[tuple[str, str]] = set()
        self.watch = Watch()

    def begin(self, step: int) -> bool:
        """Sample this step? (steps K, 2K, ...); from here to :meth:`end` the casts are recorded."""
        global _ACTIVE
        if step % self.every:
            return False
        self._rows, self._seen = [], set()
        _ACTIVE = self
        return True

    def add(self, site: str, role: str, t, fmt, scale, quantized) -> None:
        if (site, role) in self._seen:  # the first micro-batch only
            return
        self._seen.add((site, role))
        self._rows.append((site, KINDS[role], fmt.name, tensor_stats(t, fmt, scale, quantized)))

    def end(self, step: int) -> dict[str, Any] | None:
        """The step's record (one host copy of all statistics), its warnings in ``record["warnings"]``."""
        global _ACTIVE
        if _ACTIVE is not self:
            return None
        _ACTIVE = None
        if not self._rows:
            return None
        import torch

        values = torch.stack([r[3] for r in self._rows]).cpu().tolist()
        finite = lambda v: None if v != v else v  # noqa: E731 (NaN: not applicable)
        layers = [row(site, kind, fmt, amax=v[0], scale=finite(v[3]), underflow=v[1], saturation=finite(v[2]))
                  for (site, kind, fmt, _), v in zip(self._rows, values)]
        return self.with_warnings({"record": RECORD, "step": step, "layers": layers})

    def with_warnings(self, rec: dict[str, Any]) -> dict[str, Any]:
        """``rec`` with the early warnings it raises (``rec["warnings"]``, where there are any)."""
        warnings = self.watch.update(rec)
        if warnings:
            rec["warnings"] = warnings
        return rec


@dataclass
class Watch:
    """Early warning: names a (layer, kind) once its saturation or underflow has been past the
    threshold for ``samples`` samples in a row, with fp8lab's remedies."""

    saturation: float = SATURATION_WARN
    underflow: float = UNDERFLOW_WARN
    samples: int = WARN_SAMPLES
    _runs: dict = field(default_factory=dict)
    warned: set = field(default_factory=set)

    def update(self, rec: dict[str, Any]) -> list[str]:
        out = []
        for row in rec["layers"]:
            for metric, limit in (("saturation", self.saturation), ("underflow", self.underflow)):
                key = (row["layer"], row["kind"], metric)
                value = row.get(metric)
                count, first = self._runs.get(key, (0, None))
                if value is not None and value >= limit:
                    count, first = count + 1, first if count else rec["step"]
                else:
                    count, first = 0, None
                self._runs[key] = (count, first)
                if count >= self.samples and key not in self.warned:
                    self.warned.add(key)
                    out.append(warning_text(row, metric, value, limit, count, first, rec["step"]))
        return out


def warning_text(row: dict[str, Any], metric: str, value: float, limit: float, count: int, first: int, step: int) -> str:
    what = "saturate at the format's max" if metric == "saturation" else "underflow to zero"
    return (f"FP8 health: {row['layer']} {row['kind']} ({row['format']}): {value:.2%} of its values {what} "
            f"(threshold {limit:.2%}) in {count} samples in a row, steps {first}-{step}; remedies: " + "; ".join(REMEDIES))


def records(recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fp8_stats records among metrics.jsonl records."""
    return [r for r in recs if isinstance(r, dict) and r.get("record") == RECORD]


def block_of(layer: str) -> str:
    """A GEMM site's decoder block ('block 3'), from the first number in its name; else the name."""
    m = re.search(r"\.(\d+)\.", f".{layer}.")
    return f"block {int(m.group(1)):02d}" if m else layer


def table(recs: Iterable[dict[str, Any]]):
    """One row per (step, layer, kind) of the fp8_stats records, with the layer's block (a DataFrame)."""
    import pandas as pd

    rows = [{"step": r["step"], **row, "block": block_of(row["layer"])} for r in records(recs) for row in r["layers"]]
    cols = ["step", "layer", "kind", "format", "amax", "scale", "underflow", "saturation", "block"]
    return pd.DataFrame(rows, columns=cols)


def source_text(recs: Iterable[dict[str, Any]]) -> str:
    """Who read a run's casts, in words (records of ``--fp8-stats-source te-debug`` say so; older ones do not)."""
    if any(r.get("source") == TE_DEBUG for r in records(recs)):
        return "read by Transformer Engine's debug API (nvdlfw-inspect): every GEMM, all micro-batches of each sampled step"
    return "read by fp8lab (the emulator's quantizers, or hooks on TE's modules: the first micro-batch of each sampled step)"


def warnings_of(recs: Iterable[dict[str, Any]]) -> list[str]:
    return [w for r in records(recs) for w in r.get("warnings", [])]


# ----------------------------------------------------------------------------------------------
# the backends' sites
# ----------------------------------------------------------------------------------------------

def attach(model, backend: str | None, every: int) -> HealthStats | None:
    """A collector for ``model`` converted by ``backend`` (emulated: its quantizers name their GEMM;
    te: hooks on the fused modules), or None when the model has no FP8 GEMM to watch."""
    if backend == "emulated":  # its FP8Gemm modules say so (a class flag: no import of the backend here)
        sites = [(n, m) for n, m in model.named_modules() if getattr(m, "fp8lab_gemm", False)]
        for name, m in sites:
            m.__dict__["_fp8lab_site"] = name  # plain attribute: the quantizers report under this name
            if m.__dict__.get("_fp8lab_q") is not None:
                m.__dict__["_fp8lab_q"].site = name
    elif backend == "te":
        sites = _te_hooks(model)
    else:
        return None
    return HealthStats(every) if sites else None


def _te_hooks(model) -> list[str]:
    """Forward hooks on TE's LayerNormLinear / Linear / LayerNormMLP that report while a step is sampled."""
    import transformer_engine.pytorch as te

    names = []
    for name, m in model.named_modules():
        if isinstance(m, (te.LayerNormLinear, te.Linear, te.LayerNormMLP)):
            m.register_forward_hook(_TEHook(name, m))
            names.append(name)
    return names


def _formats():
    """fp8lab.fp8.formats, imported when a TE module's casts are read: it imports torch, and planning reads this module."""
    from fp8lab.fp8 import formats

    return formats


class _TEHook:
    """One TE module's operands: input (normalised as the module does), weights, output gradient."""

    # fp8_meta indices of TE's FP8FwdTensors / FP8BwdTensors: GEMM1 input, weight; GEMM2 weight; grad output 1
    X, W, W2, G = 0, 1, 4, 0

    def __init__(self, name: str, module):
        self.name, self.kind = name, type(module).__name__

    def __call__(self, module, args, output) -> None:
        if not watching() or not getattr(module, "fp8", False):
            return
        formats = _formats()
        mlp = self.kind == "LayerNormMLP"
        first = f"{self.name}.fc1" if mlp else self.name
        if (first, "x") in _ACTIVE._seen:  # a later micro-batch of the sampled step: nothing to compute
            return
        fwd, bwd = formats.E4M3, self._grad_format(module)
        x = self._normalised(module, args[0]) if self.kind != "Linear" else args[0]
        observe(first, "x", x, fwd, self._scale(module, "scaling_fwd", self.X, x, fwd))
        w1 = module.fc1_weight if mlp else module.weight
        observe(first, "w", w1, fwd, self._scale(module, "scaling_fwd", self.W, w1, fwd))
        last = f"{self.name}.fc2" if mlp else self.name
        if mlp:
            observe(last, "w", module.fc2_weight, fwd, self._scale(module, "scaling_fwd", self.W2, module.fc2_weight, fwd))
        out = output[0] if isinstance(output, tuple) else output
        if out.requires_grad:
            out.register_hook(lambda g: observe(last, "g", g, bwd, self._scale(module, "scaling_bwd", self.G, g, bwd)))

    @staticmethod
    def _grad_format(module):
        formats = _formats()
        rec = module.fp8_meta.get("recipe")
        fmt = getattr(getattr(rec, "fp8_format", None), "name", "HYBRID")
        return formats.E5M2 if fmt == "HYBRID" else formats.E4M3

    @staticmethod
    def _scale(module, which: str, index: int, t, fmt):
        """TE's delayed-scaling scale for this operand, else (current scaling) max / amax, as TE computes it."""
        formats = _formats()
        rec = module.fp8_meta.get("recipe")
        meta = module.fp8_meta.get(which)
        delayed = bool(getattr(rec, "delayed", lambda: False)())  # TE's Recipe.delayed(): a scale from the history
        if delayed and getattr(meta, "scale", None) is not None and meta.scale.numel() > index:
            return meta.scale[index]
        margin = getattr(rec, "margin", 0) or 0
        return formats.current_scale(t, fmt, margin)

    @staticmethod
    def _normalised(module, x):
        import torch.nn.functional as F

        w, eps = module.layer_norm_weight, module.eps
        if getattr(module, "normalization", "RMSNorm") == "LayerNorm":
            return F.layer_norm(x.float(), (x.shape[-1],), w.float(), module.layer_norm_bias.float(), eps)
        return F.rms_norm(x.float(), (x.shape[-1],), w.float(), eps)


# ----------------------------------------------------------------------------------------------
# reading them back
# ----------------------------------------------------------------------------------------------

def read(path) -> list[dict[str, Any]]:
    """The fp8_stats records of a trainer folder (its metrics.jsonl) or of a result file."""
    from pathlib import Path

    p = Path(path)
    p = p / "metrics.jsonl" if p.is_dir() else p
    return fmetrics.read_metrics(p, RECORD) if p.is_file() else []


def _stats_files(sources):
    """(name, file, its fp8_stats records) of each file with some, in the order :func:`of_sources` lists them;
    each file read once."""
    import json
    from pathlib import Path

    items = [RESULTS_DIR] if sources is None else [sources] if isinstance(sources, (str, Path)) else list(sources)
    for item in (Path(i) for i in items if isinstance(i, (str, Path))):  # a collect table holds no statistics
        files = [item / "metrics.jsonl"] if (item / "metrics.jsonl").is_file() else (
            sorted(item.rglob("*.jsonl")) if item.is_dir() else [item])
        for f in files:
            if not f.is_file():
                continue
            text = read_result_text(f)
            recs = fmetrics.metrics_in(text, RECORD)
            if not recs:
                continue
            if f.name == "metrics.jsonl":
                yield f.parent.name, f, recs
            else:
                first = json.loads(text.split("\n", 1)[0])
                yield first.get("run_id") or f.stem, f, recs


def of_sources(sources) -> dict[str, list[dict[str, Any]]]:
    """run_id -> fp8_stats records, from what ``fp8lab.analysis.load_runs`` reads (trainer folders, result
    files, folders holding them; None: data/results), named as it names the runs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, _, recs in _stats_files(sources):
        out[name] = recs
    return out


def files_of_sources(sources) -> dict[str, Any]:
    """run name -> the file holding its fp8_stats records: :func:`of_sources`'s names and order (a results index
    keeps it, so that a view reads only the statistics it shows)."""
    out: dict[str, Any] = {}
    for name, path, _ in _stats_files(sources):
        out[name] = path
    return out


class StatsFiles(Mapping):
    """run name -> fp8_stats records, as :func:`of_sources` gives them, from a known name -> file map
    (:func:`files_of_sources`): a file is read when its records are first asked for, once."""

    def __init__(self, files: dict[str, Any]):
        self.files = dict(files)
        self._read: dict[str, list[dict[str, Any]]] = {}

    def __getitem__(self, name: str) -> list[dict[str, Any]]:
        if name not in self._read:
            self._read[name] = read(self.files[name])
        return self._read[name]

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def of_runs(runs) -> dict[str, list[dict[str, Any]]]:
    """run_id -> its fp8_stats records, for the runs of a ``fp8lab.analysis.load_runs`` table that have
    some (found through each run's ``source``, a path relative to the repository or the working folder)."""
    from pathlib import Path

    out: dict[str, list[dict[str, Any]]] = {}
    if not len(runs) or "source" not in runs:
        return out
    for run_id, source in runs[["run_id", "source"]].drop_duplicates().itertuples(index=False):
        if not isinstance(source, str):
            continue
        path = next((b / source for b in (REPO_ROOT, Path.cwd()) if (b / source).exists()), None)
        recs = read(path) if path is not None else []
        if recs:
            out[run_id] = recs
    return out
