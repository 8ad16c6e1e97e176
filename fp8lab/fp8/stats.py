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
  committed GPU check (the plan's evidence, fp8lab.plan.evidence) passed; the committed one failed on cost
  at llama-1b):
  TE's own debug API (LogFp8TensorStats, LogTensorStats) sees every GEMM of the fused modules, fc2's input and
  fc1's gradient included, summed over the sampled step's micro-batches (fp8lab.fp8.te_debug).

Off (decided once by the rule, fp8lab.plan.fp8_stats, with the reason) for BF16 runs, under CUDA graphs (a replayed
graph runs no Python hooks) and under ``--compile`` (the hooks' state would recompile the blocks at each sample).

:class:`Watch` turns the records into an early warning: a layer whose saturation or underflow is
past its threshold for ``WARN_SAMPLES`` samples in a row is named once, with the remedies fp8lab has.
The records are read back by fp8lab.analysis.fp8_stats.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RECORD = "fp8_stats"  # metrics.jsonl record type (step records carry no "record" key)
# --fp8-stats-source: who reads the casts on TE (decided once by fp8lab.plan.fp8_stats.fp8_stats_decision). te-debug:
# TE's
# own debug API (nvdlfw-inspect; fp8lab.fp8.te_debug), every GEMM of the fused layers, all micro-batches of
# the sampled step; fp8lab: this module's hooks on TE's modules (the emulated backend: always its own quantizers)
TE_DEBUG, OWN = "te-debug", "fp8lab"
SOURCES = ("auto", TE_DEBUG, OWN)
KINDS = {"x": "activation", "w": "weight", "g": "gradient"}
SATURATION_WARN = 1e-3  # 0.1% of a tensor's values clipped at the format's max
UNDERFLOW_WARN = 0.25  # a quarter of the non-zero values flushed to 0
WARN_SAMPLES = 3  # that many samples in a row before the run warns
REMEDIES = ("--recipe current (each tensor scaled from its own amax: nothing clips)",
            "--recipe delayed:amax_history_len=16 (a short history: a spike stops shrinking the scale sooner)",
            "--bf16-edge-blocks 1 (the first and last decoder blocks in BF16)")

# the collector of the step being sampled (a global: backward may run on another thread)
_ACTIVE: "HealthStats | None" = None


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
                        torch.as_tensor(scale, dtype=torch.float32, device=a.device).reshape(())
                        if scale is not None else nan])


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


def warning_text(row: dict[str, Any], metric: str, value: float, limit: float, count: int, first: int,
                 step: int) -> str:
    what = "saturate at the format's max" if metric == "saturation" else "underflow to zero"
    return (f"FP8 health: {row['layer']} {row['kind']} ({row['format']}): {value:.2%} of its values {what} "
            f"(threshold {limit:.2%}) in {count} samples in a row, steps {first}-{step}; remedies: " +
            "; ".join(REMEDIES))


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
    """fp8lab.fp8.formats, imported when a TE module's casts are read: it imports torch, and planning reads this
    module."""
    from fp8lab.fp8 import formats  # torch: planning reads this module

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
            observe(last, "w", module.fc2_weight, fwd,
                    self._scale(module, "scaling_fwd", self.W2, module.fc2_weight, fwd))
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
