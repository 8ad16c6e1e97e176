"""Convert a Hugging Face Llama / Mistral / Qwen2 / GPT-Neo model for FP8 training, check it, and get HF weights back.

    from fp8lab.model.models import build_model
    from fp8lab.fp8.convert import convert_model, autocast, check_equivalence, export_hf_state_dict

    hf = build_model("llama-tiny")
    fp8 = convert_model(hf, backend="emulated", fuse=True)      # "te" on a Hopper GPU
    with autocast("emulated", recipe=None):                      # FP8 region
        loss = fp8(input_ids, labels=input_ids).loss
    hf_sd = export_hf_state_dict(fp8)                            # loads into LlamaForCausalLM

What stays in high precision by default, on every backend: the token (and position) embeddings,
the final norm, the LM head, attention's softmax (TE's default DotProductAttention) and all
normalisations; only the GEMMs of the decoder blocks run in FP8.

``fuse=False`` swaps modules one for one, in place (the returned model *is* the HF model, now with
TE / torchao / emulated layers; keep a ``copy.deepcopy`` if you need the original).
``fuse=True`` returns a new fused model (QKV and gate/up GEMMs fused) holding copies of the
weights; the HF model is left untouched. torchao has no fused form: it always swaps Linear layers.

``module_filter(module, fqn) -> bool`` picks what runs in FP8: nn.Linear layers when
``fuse=False`` (default: all but ``lm_head``), whole decoder blocks (the HF block and its fqn, e.g.
``model.layers.0``) when ``fuse=True`` (default: all); unselected blocks run in high precision.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from fp8lab.fp8 import backends as registry
from fp8lab.fp8 import fused as _fused
from fp8lab.fp8.backends import (FP8_ALL_GATHER_BACKENDS, BackendUnavailableError, available_backends, get_backend,
                                 require)
from fp8lab.fp8.recipe import Recipe
from fp8lab.model.models import build_model, default_dtype

__all__ = [
    "convert_model", "autocast", "available_backends", "Recipe", "export_hf_state_dict", "export_hf_model",
    "check_equivalence", "EquivalenceReport", "ConversionInfo", "BackendUnavailableError", "pick_backend",
    "describe_modules", "weight_mapping", "time_forward_backward", "compare_speed", "save_hf_checkpoint",
    "edge_blocks_filter", "fp8_lm_head",
]


@dataclass(frozen=True)
class ConversionInfo:
    """What a conversion did; attached to the converted model as ``model.fp8lab_conversion``."""

    backend: str
    recipe: Recipe
    fused: bool
    architecture: str  # the HF model_type: 'llama' | 'mistral' | 'qwen2' | 'gpt_neo' (fp8lab.model.families)
    fp8_modules: tuple[str, ...]  # fqns whose GEMMs run in FP8 inside autocast
    high_precision: tuple[str, ...]  # fqns kept in high precision (embeddings, LM head, ...)


def edge_blocks_filter(model: nn.Module, n: int) -> Callable[[nn.Module, str], bool]:
    """A ``module_filter`` that keeps the first ``n`` and last ``n`` decoder blocks of ``model`` out of FP8.

    Why: the first and last blocks see the widest activation ranges (fresh embeddings, logits about
    to be formed); keeping them in BF16 is a common remedy when FP8 loss trails BF16. Works with
    ``fuse=True`` (whole blocks) and ``fuse=False`` (the nn.Linear layers inside the blocks; the LM
    head stays high precision as by default).
    """
    names = [fqn for fqn, _ in _fused.decoder_layers(model)]
    if not isinstance(n, int) or isinstance(n, bool) or not 0 <= 2 * n < len(names):
        raise ValueError(f"edge_blocks_filter: n must be an integer in [0, {(len(names) - 1) // 2}] for a model of "
                         f"{len(names)} blocks (some must stay FP8), got {n!r}")
    keep_hp = set(names[:n]) | set(names[len(names) - n:]) if n else set()

    def in_any(fqn: str, group) -> bool:
        return any(fqn == b or fqn.startswith(b + ".") for b in group)

    def flt(module: nn.Module, fqn: str) -> bool:
        return in_any(fqn, names) and not in_any(fqn, keep_hp)

    return flt


def _resolve_recipe(backend, recipe) -> Recipe:
    return backend.default_recipe if recipe is None else Recipe.parse(recipe)


def _fp8_all_gather_option(be, fp8_all_gather: bool) -> dict:
    """The backend keyword of FP8 all-gather, or a clear refusal where the backend has none."""
    if not isinstance(fp8_all_gather, bool):
        raise ValueError(f"fp8_all_gather must be True or False, got {fp8_all_gather!r}")
    if not fp8_all_gather:
        return {}
    if be.name not in FP8_ALL_GATHER_BACKENDS:
        raise ValueError(f"fp8_all_gather=True needs backend {' or '.join(FP8_ALL_GATHER_BACKENDS)}; {be.name!r} has "
                         "no FP8 all-gather in fp8lab")
    return {"fp8_all_gather": True}


def convert_model(model: nn.Module, backend: str = "te", recipe: Recipe | str | None = None, fuse: bool = True,
                  module_filter: Callable[[nn.Module, str], bool] | None = None, *,
                  fp8_all_gather: bool = False) -> nn.Module:
    """Convert ``model`` (a class of ``fp8lab.model.families.SUPPORTED``: Llama, Mistral, Qwen2, GPT-Neo) for FP8 on
    ``backend``.

    Every check (architecture, backend installed, FP8 GPU, recipe supported, GEMM shapes divisible
    by 16) runs before anything is built. See the module docstring for ``fuse`` and ``module_filter``.
    ``fp8_all_gather`` (torchao only): the converted weights all-gather in FP8 under FSDP2.
    """
    arch = _fused.architecture_of(model)
    if not isinstance(fuse, bool):
        raise ValueError(f"fuse must be True or False, got {fuse!r}")
    if module_filter is not None and not callable(module_filter):
        raise ValueError("module_filter must be a callable (module, fqn) -> bool, or None")
    if getattr(model, "fp8lab_conversion", None) is not None:
        raise ValueError(f"model is already converted ({model.fp8lab_conversion.backend}); convert the HF model")
    be = require(backend)
    rec = _resolve_recipe(be, recipe)
    extra = _fp8_all_gather_option(be, fp8_all_gather)
    converted = be.convert(model, rec, fuse=fuse, module_filter=module_filter, **extra)
    fused = isinstance(converted, _fused.FusedCausalLM)
    if fused:
        fp8 = tuple(f"{n}.{p}" for n, b in _fused.decoder_layers(converted) if b.fp8 for p in ("qkv", "proj", "mlp"))
        hp = tuple(n for n in ("embed", "pos_embed", "norm", "lm_head") if getattr(converted, n) is not None)
        hp += tuple(n for n, b in _fused.decoder_layers(converted) if not b.fp8)
    else:
        fp8 = tuple(sorted(getattr(converted, "_fp8lab_swapped", ())))
        hp = tuple(n for n, m in converted.named_modules()
                   if isinstance(m, (nn.Embedding, nn.Linear)) and n not in fp8)
    info = ConversionInfo(backend, rec, fused, arch, fp8, hp)
    converted.fp8lab_conversion = info
    return converted


def fp8_lm_head(converted: nn.Module) -> nn.Module:
    """Run the LM head's GEMM in FP8 too (``--fp8-lm-head``, a study: by default the head stays in high precision).

    ``converted``: a model from :func:`convert_model` on a backend with ``fp8_linear`` (te, emulated). Its ``lm_head``
    becomes the backend's FP8 layer holding the same parameters (a head tied to the embedding stays tied); the
    conversion record lists it among the FP8 modules. Returns ``converted``, changed in place."""
    info = _info(converted)
    if info.backend not in registry.FP8_LM_HEAD_BACKENDS:
        raise ValueError(f"--fp8-lm-head: the {info.backend} backend has no FP8 LM head; allowed backends: "
                         + " | ".join(registry.FP8_LM_HEAD_BACKENDS))
    make = get_backend(info.backend).fp8_linear
    head = getattr(converted, "lm_head", None)
    if type(head) is not nn.Linear:
        raise ValueError(f"--fp8-lm-head: the model's lm_head is {type(head).__name__}, not a high-precision nn.Linear")
    if head.in_features % 16 or head.out_features % 16:
        raise ValueError(f"--fp8-lm-head: lm_head has shape (out={head.out_features}, in={head.in_features}); FP8 "
                         "GEMMs need both divisible by 16 (a vocabulary padded to a multiple of 16, or --fp8-lm-head "
                         "False)")
    converted.lm_head = make(head)
    converted.fp8lab_conversion = dataclasses.replace(
        info, fp8_modules=(*info.fp8_modules, "lm_head"),
        high_precision=tuple(n for n in info.high_precision if n != "lm_head"))
    return converted


def autocast(backend, recipe: Recipe | str | None = None, enabled: bool = True):
    """One FP8 context manager for every backend (TE's ``te.autocast``, the emulator's region;
    torchao converts statically, so ``enabled=False`` routes its layers through plain matmuls).

    ``backend``: a name (looked up and checked for this machine on each call) or the backend object
    itself (``get_backend(name)``, what a training loop holds: nothing is looked up per call)."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    if not isinstance(backend, str):
        return backend.autocast(_resolve_recipe(backend, recipe), enabled)
    be = require(backend) if enabled else get_backend(backend)
    return be.autocast(_resolve_recipe(be, recipe), enabled)


def pick_backend(requested: str = "auto") -> str:
    """The FP8 backend for ``requested``: 'auto' is the trainer's rule (fp8lab.fp8.backends.auto_fp8_backend) for
    this process's machine: 'te' where Transformer Engine runs, 'emulated' on a machine with no CUDA GPU,
    and refused (BackendUnavailableError with the install command and the explicit alternatives) on a
    CUDA GPU without a usable TE: no silent pure-PyTorch FP8 on a GPU. Other names are checked and
    returned as they are (an explicit 'emulated' runs anywhere)."""
    if requested != "auto":
        get_backend(requested)
        return requested
    try:
        return registry.auto_fp8_backend(registry.detect_machine(
            torch.device("cuda" if torch.cuda.is_available() else "cpu")))[0]
    except ValueError as exc:
        raise BackendUnavailableError(str(exc)) from None


# --------------------------------------------------------------------------------------------
# weights back to Hugging Face
# --------------------------------------------------------------------------------------------

def _info(converted: nn.Module) -> ConversionInfo:
    info = getattr(converted, "fp8lab_conversion", None)
    if info is None:
        raise ValueError("not a converted model: pass the result of fp8lab.fp8.convert.convert_model")
    return info


def _hf_class_and_config(converted: nn.Module):
    if isinstance(converted, _fused.FusedCausalLM):
        return converted.hf_class, converted.config
    return type(converted), converted.config


def export_hf_state_dict(converted: nn.Module) -> dict[str, torch.Tensor]:
    """The converted model's weights as a state dict of its original HF class (strict-loadable).

    Fused QKV and gate/up weights are split back; TE's FP8 metadata (``_extra_state``) is dropped.
    Tensors are detached copies, in the model's dtype and device.
    """
    return hf_state_dict_from(converted, converted.state_dict())


def hf_state_dict_from(converted: nn.Module, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a state dict *of* ``converted`` (e.g. one FSDP2 gathered onto rank 0) to HF names.

    The same mapping as :func:`export_hf_state_dict`, for weights that live outside the module.
    """
    _info(converted)
    cls, cfg = _hf_class_and_config(converted)
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in cls(cfg).state_dict().items()}
    if isinstance(converted, _fused.FusedCausalLM):
        return _fused.fused_to_hf(state_dict, converted.spec, shapes)
    sd = {k: v.detach().clone() for k, v in state_dict.items() if not k.endswith("_extra_state")}
    if set(sd) != set(shapes):
        raise ValueError(f"state dict keys differ from {cls.__name__}: "
                         f"missing {sorted(set(shapes) - set(sd))[:5]}, extra {sorted(set(sd) - set(shapes))[:5]}")
    bad = [k for k in sd if sd[k].shape != shapes[k]]
    if bad:
        raise ValueError(f"shapes differ from {cls.__name__} for {bad[:5]}")
    return sd


def export_hf_model(converted: nn.Module) -> nn.Module:
    """A plain HF model (original class, on CPU, the converted model's dtype) holding its weights.

    This materialises a full model on the CPU; for large models :func:`save_hf_checkpoint` writes
    the same checkpoint without building one.
    """
    cls, cfg = _hf_class_and_config(converted)
    sd = export_hf_state_dict(converted)
    with default_dtype(next(iter(sd.values())).dtype), torch.device("cpu"):
        hf = cls(cfg)
    hf.load_state_dict(sd, strict=True)
    return hf.eval()


def save_hf_checkpoint(converted: nn.Module, directory) -> list[str]:
    """Write a ``from_pretrained``-loadable checkpoint (config.json + model.safetensors) of the
    converted model's weights, without instantiating the HF model. Returns the files written."""
    from pathlib import Path

    from safetensors.torch import save_file

    cls, cfg = _hf_class_and_config(converted)
    sd = export_hf_state_dict(converted)
    cfg = copy.deepcopy(cfg)
    cfg.architectures = [cls.__name__]
    if getattr(cfg, "tie_word_embeddings", False):
        sd.pop("lm_head.weight", None)  # tied: HF re-ties it to the input embedding on load
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(out)
    save_file({k: v.contiguous().cpu() for k, v in sd.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    return [str(out / "config.json"), str(out / "model.safetensors")]


# --------------------------------------------------------------------------------------------
# numerical equivalence
# --------------------------------------------------------------------------------------------

@dataclass
class LayerDiff:
    name: str  # converted model's block fqn
    rel_diff: float  # ||converted - reference|| / ||reference|| of the block output
    max_abs_diff: float


@dataclass
class EquivalenceReport:
    """Differences between a reference HF model and a converted one on the same batch."""

    backend: str
    fp8: bool
    recipe: str
    dtype: str
    logits_max_abs_diff: float
    logits_rel_diff: float  # Frobenius norm of the difference / norm of the reference logits
    loss_reference: float
    loss_converted: float
    loss_abs_diff: float
    loss_rel_diff: float
    per_layer: list[LayerDiff] | None = field(default=None)
    fp32: TruthDiff | None = field(default=None)  # both models against an fp32 forward, when asked for

    def three_way(self) -> list[dict[str, Any]]:
        """Rows for a table: logits (and, per layer, each block's output), the converted model against
        the reference, and each of them against the fp32 truth (needs ``fp32_reference``)."""
        if self.fp32 is None:
            raise ValueError("no fp32 truth in this report: call check_equivalence(..., fp32_reference=True)")
        rows = [{"where": "logits", "converted vs reference": self.logits_rel_diff,
                 "reference vs fp32": self.fp32.reference_logits_rel_diff,
                 "converted vs fp32": self.fp32.converted_logits_rel_diff}]
        for i, t in enumerate(self.fp32.per_layer or []):
            rows.append({"where": f"block {i}",
                         "converted vs reference": self.per_layer[i].rel_diff if self.per_layer else None,
                         "reference vs fp32": t.reference_rel_diff, "converted vs fp32": t.converted_rel_diff})
        return rows

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LayerTruth:
    name: str  # converted model's block fqn
    reference_rel_diff: float  # ||reference - fp32|| / ||fp32|| of the block output
    converted_rel_diff: float  # ||converted - fp32|| / ||fp32||


@dataclass
class TruthDiff:
    """The reference (e.g. HF in bf16) and the converted model, each against an fp32 forward of the same
    weights. A correct conversion in bf16 need not match HF's bf16 forward (the two round differently,
    HF's bf16 RoPE drifts at long sequences): what it must do is be at least as close to fp32."""

    dtype: str  # of the truth: 'float32'
    reference_logits_rel_diff: float
    converted_logits_rel_diff: float
    loss_truth: float
    reference_loss_abs_diff: float
    converted_loss_abs_diff: float
    per_layer: list[LayerTruth] | None = field(default=None)

    @property
    def converted_at_least_as_close(self) -> bool:
        """The converted model's logits are no further from fp32 than the reference's, up to float32
        rounding (``FP32_ROUNDING``: an fp32 reference is the truth itself, 0 away)."""
        return self.converted_logits_rel_diff <= self.reference_logits_rel_diff + FP32_ROUNDING


FP32_ROUNDING = 1e-5  # relative difference two fp32 forwards of one model may show (summation order)


def _batch(batch) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return batch, batch
    if isinstance(batch, dict) and "input_ids" in batch:
        return batch["input_ids"], batch.get("labels", batch["input_ids"])
    raise ValueError("batch must be a LongTensor of input_ids or a dict with 'input_ids' (and optional 'labels')")


def _out_tensor(o) -> torch.Tensor:
    return o[0] if isinstance(o, (tuple, list)) else o


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x - ref).norm() / ref.norm().clamp_min(1e-30))


def _fp32_truth(reference: nn.Module, fp32_reference: nn.Module | bool) -> nn.Module:
    """The fp32 model to compare against: the one given, or an fp32 copy of ``reference`` (its weights,
    as stored, computed in fp32)."""
    if fp32_reference is True:
        truth = copy.deepcopy(reference).float()
    elif isinstance(fp32_reference, nn.Module):
        truth = fp32_reference
    else:
        raise ValueError(f"fp32_reference={fp32_reference!r}; allowed: None or False (no fp32 truth), True (an fp32 "
                         "copy of the reference), or an fp32 nn.Module with the reference's weights")
    dtypes = {p.dtype for p in truth.parameters() if p.is_floating_point()}
    if dtypes != {torch.float32}:
        raise ValueError(f"fp32_reference: its parameters must be float32, found {sorted(map(str, dtypes))}")
    return truth


def check_equivalence(reference: nn.Module, converted: nn.Module, batch, per_layer: bool = False, *,
                      fp8: bool = False, recipe: Recipe | str | None = None, warmup: int = 2,
                      fp32_reference: nn.Module | bool | None = None) -> EquivalenceReport:
    """Run both models on ``batch`` and report logits and loss differences (per block if asked).

    ``fp8=True`` runs the converted model inside its backend's FP8 autocast (the conversion's
    recipe unless ``recipe`` is given), after ``warmup`` forward passes so that delayed scaling
    has an amax history (TE updates it only with grad enabled, so the passes run with grad on).

    ``fp32_reference``: also run an fp32 forward of the same weights (``True``: an fp32 copy of
    ``reference``; or pass one) and report both models against it in ``report.fp32`` (per block too
    with ``per_layer``). A bf16 conversion is right when it is at least as close to fp32 as the bf16
    reference is: at real widths HF's own bf16 forward is ~10% from fp32, so "converted vs reference"
    alone overstates the conversion's error.
    """
    info = _info(converted)
    truth = None if fp32_reference is None or fp32_reference is False else _fp32_truth(reference, fp32_reference)
    ids, labels = _batch(batch)
    rec = info.recipe if recipe is None else Recipe.parse(recipe)
    be = get_backend(info.backend)
    ctx = (lambda: be.autocast(rec, True)) if fp8 else (lambda: be.autocast(rec, False))
    ref_layers = _fused.decoder_layers(reference)
    conv_layers = _fused.decoder_layers(converted)
    if len(ref_layers) != len(conv_layers):
        raise ValueError(f"reference has {len(ref_layers)} blocks, converted {len(conv_layers)}")
    truth_layers = _fused.decoder_layers(truth) if truth is not None else []
    if truth is not None and len(truth_layers) != len(ref_layers):
        raise ValueError(f"fp32_reference has {len(truth_layers)} blocks, reference {len(ref_layers)}")
    captured: dict[str, list[torch.Tensor]] = {"ref": [], "conv": [], "truth": []}
    hooks = []
    if per_layer:
        for key, layers in (("ref", ref_layers), ("conv", conv_layers), ("truth", truth_layers)):
            for _, mod in layers:
                hooks.append(mod.register_forward_hook(
                    lambda m, i, o, key=key: captured[key].append(_out_tensor(o).detach().float())))
    modes = (reference.training, converted.training, truth.training if truth is not None else False)
    reference.eval(), converted.eval()
    truth_out = None
    try:
        with torch.no_grad():
            ref_out = reference(input_ids=ids, labels=labels)
            if truth is not None:
                truth.eval()
                truth_out = truth(input_ids=ids.to(next(truth.parameters()).device),
                                  labels=labels.to(next(truth.parameters()).device))
        with torch.enable_grad():
            for _ in range(warmup if fp8 else 0):
                with ctx():
                    converted(input_ids=ids, labels=labels)
            captured["conv"].clear()
            with ctx():
                conv_out = converted(input_ids=ids, labels=labels)
    finally:
        for h in hooks:
            h.remove()
        reference.train(modes[0]), converted.train(modes[1])
        if truth is not None:
            truth.train(modes[2])
    a, b = ref_out.logits.detach().float(), conv_out.logits.detach().float()
    la, lb = float(ref_out.loss.detach()), float(conv_out.loss.detach())
    layers = None
    if per_layer:
        layers = [
            LayerDiff(name, _rel(y, x), float((y - x).abs().max()))
            for (name, _), x, y in zip(conv_layers, captured["ref"], captured["conv"])
        ]
    fp32 = None
    if truth_out is not None:
        t = truth_out.logits.detach().float().to(a.device)
        lt = float(truth_out.loss.detach())
        per = None
        if per_layer:
            per = [LayerTruth(name, _rel(x, tt.to(x.device)), _rel(y, tt.to(y.device)))
                   for (name, _), x, y, tt in zip(conv_layers, captured["ref"], captured["conv"], captured["truth"])]
        fp32 = TruthDiff("float32", _rel(a, t), _rel(b, t), lt, abs(la - lt), abs(lb - lt), per)
    return EquivalenceReport(
        info.backend, fp8, rec.describe(), str(conv_out.logits.dtype).replace("torch.", ""),
        float((a - b).abs().max()), _rel(b, a),
        la, lb, abs(la - lb), abs(la - lb) / max(abs(la), 1e-30), layers, fp32,
    )


# --------------------------------------------------------------------------------------------
# notebook helpers: module tree, weight map, timing
# --------------------------------------------------------------------------------------------

def describe_modules(model: nn.Module, blocks: int = 1) -> str:
    """The module tree with parameter shapes, showing only the first ``blocks`` decoder blocks."""
    layer_names = [n for n, _ in _fused.decoder_layers(model)] if _is_supported(model) else []
    skip = tuple(n + "." for n in layer_names[blocks:])
    lines = []
    for name, mod in model.named_modules():
        if name in layer_names[blocks:] or (skip and name.startswith(skip)):
            continue
        depth = name.count(".") + 1 if name else 0
        shapes = ", ".join(f"{p}{tuple(t.shape)}" for p, t in mod.named_parameters(recurse=False))
        lines.append(f"{'  ' * depth}{name.rpartition('.')[2] or type(model).__name__}: {type(mod).__name__}"
                     + (f"  [{shapes}]" if shapes else ""))
    if len(layer_names) > blocks:
        lines.append(f"  ... {len(layer_names) - blocks} more decoder blocks of the same structure")
    return "\n".join(lines)


def _is_supported(model) -> bool:
    try:
        _fused.decoder_layers(model)
        return True
    except ValueError:
        return False


def weight_mapping(converted: nn.Module, layer: int | None = 0) -> list[dict[str, Any]]:
    """Rows (hf_keys, converted_key, rule, shapes) of the HF -> converted weight map; layer-indexed
    rules shown for ``layer`` only (None: all layers)."""
    info = _info(converted)
    cls, cfg = _hf_class_and_config(converted)
    with torch.device("meta"):
        hf_shapes = {k: tuple(v.shape) for k, v in cls(cfg).state_dict().items()}
    conv = {k: tuple(v.shape) for k, v in converted.state_dict().items() if not k.endswith("_extra_state")}
    if not info.fused:
        rules = [_fused.Rule((k,), k) for k in hf_shapes]
    else:
        rules = _fused.expand_rules(converted.spec)
    rows = []
    for r in rules:
        idx = [int(p) for p in r.fused.split(".") if p.isdigit()]
        if layer is not None and idx and idx[0] != layer:
            continue
        rows.append({
            "hf_keys": " + ".join(r.hf), "converted_key": r.fused,
            "rule": "concat dim 0" if len(r.hf) > 1 else "copy",
            "hf_shapes": " + ".join(str(hf_shapes[k]) for k in r.hf), "converted_shape": str(conv[r.fused]),
        })
    return rows


def time_forward_backward(model: nn.Module, batch, *, backend: str | None = None, recipe: Recipe | str | None = None,
                          fp8: bool = False, warmup: int = 3, iters: int = 10) -> dict[str, float]:
    """Median forward+backward time of ``model`` on ``batch`` with CUDA events (GPU only).

    ``backend``/``fp8`` wrap the step in that backend's autocast. Gradients are cleared each step.
    """
    if not torch.cuda.is_available():
        raise ValueError("time_forward_backward needs a CUDA GPU: CPU timings of FP8 emulation mean nothing")
    if warmup < 1 or iters < 1:
        raise ValueError("warmup and iters must be >= 1")
    ids, labels = _batch(batch)
    ctx = (lambda: autocast(backend, recipe, enabled=fp8)) if backend is not None else nullcontext
    model.train()
    times = []
    for i in range(warmup + iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        with ctx():
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        end.record()
        torch.cuda.synchronize()
        model.zero_grad(set_to_none=True)
        if i >= warmup:
            times.append(start.elapsed_time(end))
    tokens = ids.numel()
    ms = statistics.median(times)
    return {"ms": ms, "tokens_per_s": tokens / (ms / 1e3), "iters": iters, "min_ms": min(times),
            "max_ms": max(times), "finite_loss": math.isfinite(float(loss.detach()))}


def compare_speed(model_name: str, *, batch_size: int = 4, seq_len: int = 512, recipe: Recipe | str | None = None,
                  warmup: int = 3, iters: int = 10, **overrides: Any) -> list[dict[str, Any]]:
    """Forward+backward time of HF bf16 vs TE bf16 vs TE FP8, unfused and fused (needs TE + FP8 GPU).

    Each variant is built fresh (same seed) in bf16 on the GPU, timed with
    :func:`time_forward_backward` and freed; ``speedup`` is relative to HF bf16.
    """
    require("te")
    variants = [("HF bf16", None, False), ("TE bf16 (swap)", False, False), ("TE FP8 (swap)", False, True),
                ("TE bf16 (fused)", True, False), ("TE FP8 (fused)", True, True)]
    rows: list[dict[str, Any]] = []
    for label, fuse, fp8 in variants:
        model = build_model(model_name, device="cuda", dtype=torch.bfloat16, **overrides)
        ids = torch.randint(0, model.config.vocab_size, (batch_size, seq_len), device="cuda")
        if fuse is not None:
            model = convert_model(model, backend="te", recipe=recipe, fuse=fuse)
        t = time_forward_backward(model, ids, backend="te" if fuse is not None else None, recipe=recipe,
                                  fp8=fp8, warmup=warmup, iters=iters)
        rows.append({"variant": label, "fused": bool(fuse), "fp8": fp8, **t})
        del model
        torch.cuda.empty_cache()
    base = rows[0]["ms"]
    for r in rows:
        r["speedup_vs_hf_bf16"] = base / r["ms"]
    return rows
