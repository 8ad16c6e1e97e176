"""FP8 training emulated in plain PyTorch: runs on any CPU or GPU, for teaching and tests.

Every GEMM the conversion selects fake-quantises its operands with ``fp8lab.fp8.formats``: input and
weight in E4M3 in the forward pass, the output gradient in E5M2 (HYBRID) or E4M3 in the backward
pass, each with its own scaling state per module as the recipe says (delayed: an amax history per
tensor, TE's semantics; current: per tensor from its own amax; block: 1x128 activations/gradients
and 128x128 weights; mxfp8: 32-element blocks along the last dimension). The matmul itself runs in
the model's dtype with its usual accumulation. Simplification: each tensor is quantised once (its
row-wise blocks) and reused in both GEMMs that consume it, where TE also keeps a column-wise copy.

``fuse=False`` swaps ``nn.Linear`` -> :class:`EmuLinear` in place (same Parameter objects).
``fuse=True`` builds the fused decoder of ``_fused`` from emulated twins of TE's LayerNormLinear /
LayerNormMLP / DotProductAttention, with the same parameter names. This changes numerics under FP8
exactly as TE's fusion does: Q, K and V share one weight scale (one GEMM), gate and up share one.
With FP8 disabled both are the HF computation (fp32 CPU matches HF to ~1e-6).

Never use this backend to claim speed: fake quantisation is slower than bf16, not faster.
"""
from __future__ import annotations

import dataclasses
import json

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from fp8lab.fp8 import formats, stats as fp8stats
from fp8lab.fp8 import fused as _fused
from fp8lab.fp8.backends import DEFAULT_RECIPES, fused_targets, linear_targets, swap_modules
from fp8lab.fp8.recipe import Recipe


@dataclass(frozen=True)
class _Region:
    enabled: bool
    recipe: Recipe | None


# the active autocast region (like torch.autocast's thread-local state); None = FP8 off
_REGION: contextvars.ContextVar[_Region | None] = contextvars.ContextVar("fp8lab_emulated_region", default=None)


def active_recipe() -> Recipe | None:
    r = _REGION.get()
    return r.recipe if r is not None and r.enabled else None


class TensorQuantizers:
    """Scaling state of one GEMM: input ``x``, weight ``w``, output gradient ``g``.

    The recipe kind's row (``fp8lab.fp8.recipe.TABLE``) names the quantizer and its blocks."""

    def __init__(self, recipe: Recipe, site: str | None = None):
        self.recipe, self.site = recipe, site  # site: the GEMM's module name, for fp8lab.fp8.stats
        self.row = recipe.row
        self.fmt = {"x": formats.E4M3, "w": formats.E4M3,
                    "g": formats.E5M2 if recipe.format == "hybrid" else formats.E4M3}
        self.delayed = {
            role: formats.DelayedScaling(recipe.amax_history_len, recipe.amax_compute_algo, recipe.margin, fmt)
            for role, fmt in self.fmt.items()
        } if self.row.quantizer == "DelayedScaling" else {}

    def __call__(self, role: str, t: torch.Tensor) -> torch.Tensor:
        if not fp8stats.watching():
            return self._quantize(role, t)
        scale = self._scale(role, t)  # the scale this cast uses (delayed: before the history takes this amax)
        q = self._quantize(role, t)
        fp8stats.observe(self.site, role, t, self.fmt[role], scale, q)
        return q

    def _scale(self, role: str, t: torch.Tensor):
        """The per-tensor scale of this cast; None for the block recipes (a scale per block)."""
        quantizer, fmt = self.row.quantizer, self.fmt[role]
        if quantizer == "DelayedScaling":
            return self.delayed[role].scale
        if quantizer == "quantize_current":
            return formats.current_scale(t, fmt, self.recipe.margin)
        return None

    def _quantize(self, role: str, t: torch.Tensor) -> torch.Tensor:
        quantizer, fmt, margin = self.row.quantizer, self.fmt[role], self.recipe.margin
        if quantizer == "DelayedScaling":
            return self.delayed[role].step(t)
        if quantizer == "quantize_current":
            return formats.quantize_current(t, fmt, margin=margin)
        if quantizer == "quantize_blockwise":  # (a block wider than the row, rowwise's, is the row: no padding)
            br, bc = self.row.block(role)
            return formats.quantize_blockwise(t, fmt, block=(br, min(bc, t.shape[-1])), margin=margin)
        if quantizer == "quantize_mxfp8":
            return formats.quantize_mxfp8(t, fmt, block=self.row.block(role))
        raise ValueError(f"the emulator has no quantizer {quantizer!r} (Recipe(kind={self.recipe.kind!r}))")


class _FP8Linear(torch.autograd.Function):
    """y = Q(x) @ Q(w)^T + b; backward with Q(grad_y) (E5M2 under HYBRID) in both gradient GEMMs (the weight
    gradient's GEMM from the unquantized grad_y and x where the recipe row says wgrad_fp8=False).

    Under ``torch.autocast`` the three GEMMs run in the autocast dtype (as the forward would), and
    the gradients come back in the dtypes of x, w and b.
    """

    @staticmethod
    def forward(ctx, x, w, b, q: TensorQuantizers):
        dev = x.device.type
        cd = torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype
        xq, wq = q("x", x), q("w", w)
        ctx.save_for_backward(xq, wq, x if not q.row.wgrad_fp8 else None)  # x: a high-precision weight gradient
        ctx.q, ctx.cd, ctx.dtypes = q, cd, (x.dtype, w.dtype, b.dtype if b is not None else None)
        with torch.autocast(dev, enabled=False):
            return F.linear(xq.to(cd), wq.to(cd), b.to(cd) if b is not None else None)

    @staticmethod
    def backward(ctx, gy):
        xq, wq, x = ctx.saved_tensors
        cd, (xd, wd, bd) = ctx.cd, ctx.dtypes
        gq = ctx.q("g", gy).to(cd)
        gx = (gq @ wq.to(cd)).to(xd)
        gw_in, x_in = (gq, xq) if x is None else (gy.to(cd), x)  # (x kept: the weight gradient's GEMM unquantized)
        gw = (gw_in.reshape(-1, gw_in.shape[-1]).t() @ x_in.to(cd).reshape(-1, x_in.shape[-1])).to(wd)
        gb = gy.reshape(-1, gy.shape[-1]).sum(0).to(bd) if bd is not None else None
        return gx, gw, gb, None


class FP8Gemm(nn.Module):
    """Holds the per-GEMM scaling state, rebuilt when the autocast recipe changes.

    Delayed scaling's amax histories and scales go into the state dict as ``_extra_state`` (as in
    Transformer Engine), so a checkpoint restores them and a resumed run scales exactly as the
    uninterrupted one. They travel as the bytes of a JSON text in a uint8 tensor (as TE's state does), so
    DCP stores a tensor, never a pickled Python object, and loading reads it with ``weights_only``.
    """

    fp8lab_gemm = True  # fp8lab.fp8.stats names each such module's casts after it

    def _quantizers(self, recipe: Recipe) -> TensorQuantizers:
        q = self.__dict__.get("_fp8lab_q")
        if q is None or q.recipe != recipe:
            q = TensorQuantizers(recipe, self.__dict__.get("_fp8lab_site"))
            self.__dict__["_fp8lab_q"] = q  # plain attribute: not a parameter
            pending = self.__dict__.pop("_fp8lab_pending", None)
            if pending and pending.get("recipe") == dataclasses.asdict(recipe):
                for role, st in pending["delayed"].items():
                    d = q.delayed[role]
                    d._history.extend(st["history"])
                    d.scale, d.steps = st["scale"], st["steps"]
        return q

    def get_extra_state(self) -> torch.Tensor:
        q = self.__dict__.get("_fp8lab_q")
        if q is None or not q.delayed:
            return torch.empty(0, dtype=torch.uint8)
        state = {"recipe": dataclasses.asdict(q.recipe),
                 "delayed": {role: {"history": list(d._history), "scale": d.scale, "steps": d.steps}
                             for role, d in q.delayed.items()}}
        return torch.frombuffer(bytearray(json.dumps(state).encode()), dtype=torch.uint8)

    def set_extra_state(self, state) -> None:
        if isinstance(state, torch.Tensor):
            state = state.cpu().numpy().tobytes()
        if not state:
            return
        pending = json.loads(bytes(state).decode())
        self.__dict__.pop("_fp8lab_q", None)  # rebuilt from the restored state at the next GEMM
        self.__dict__["_fp8lab_pending"] = pending

    def gemm(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        recipe = active_recipe()
        if recipe is None:
            return F.linear(x, w, b)
        return _FP8Linear.apply(x, w, b, self._quantizers(recipe))


class EmuLinear(nn.Linear, FP8Gemm):
    """nn.Linear whose GEMM is fake-quantised inside ``autocast`` (same parameters, same state dict)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, self.weight, self.bias)


def _norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, kind: str, eps: float) -> torch.Tensor:
    if kind == "LayerNorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    # HF LlamaRMSNorm: statistics in float32, scale by the weight in the input dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def _param(*shape, device=None, dtype=None) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype))


class EmuNorm(nn.Module):
    def __init__(self, spec: _fused.FusedSpec, device=None, dtype=None):
        super().__init__()
        self.kind, self.eps = spec.normalization, spec.eps
        self.weight = _param(spec.hidden, device=device, dtype=dtype)
        self.bias = _param(spec.hidden, device=device, dtype=dtype) if spec.normalization == "LayerNorm" else None

    def forward(self, x):
        return _norm(x, self.weight, self.bias, self.kind, self.eps)


class EmuLayerNormLinear(FP8Gemm):
    """Twin of te.LayerNormLinear: norm then one GEMM (parameter names as TE's)."""

    def __init__(self, spec: _fused.FusedSpec, out_features: int, bias: bool | None = None, device=None, dtype=None):
        super().__init__()
        self.kind, self.eps = spec.normalization, spec.eps
        self.in_features, self.out_features = spec.hidden, out_features
        self.layer_norm_weight = _param(spec.hidden, device=device, dtype=dtype)
        self.layer_norm_bias = _param(spec.hidden, device=device, dtype=dtype) if self.kind == "LayerNorm" else None
        self.weight = _param(out_features, spec.hidden, device=device, dtype=dtype)
        self.bias = _param(out_features, device=device, dtype=dtype) if (
            spec.qkv_bias if bias is None else bias) else None
        self.return_layernorm_output = False  # True: (output, the norm's output), as TE's LayerNormLinear

    def forward(self, x):
        normed = _norm(x, self.layer_norm_weight, self.layer_norm_bias, self.kind, self.eps)
        out = self.gemm(normed, self.weight, self.bias)
        return (out, normed) if self.return_layernorm_output else out


class EmuLayerNormMLP(nn.Module):
    """Twin of te.LayerNormMLP: norm -> fc1 -> SwiGLU/GELU(tanh) -> fc2, two quantised GEMMs."""

    def __init__(self, spec: _fused.FusedSpec, device=None, dtype=None):
        super().__init__()
        self.kind, self.eps, self.act = spec.normalization, spec.eps, spec.activation
        h, f = spec.hidden, spec.ffn
        fc1_out = 2 * f if self.act == "swiglu" else f
        self.layer_norm_weight = _param(h, device=device, dtype=dtype)
        self.layer_norm_bias = _param(h, device=device, dtype=dtype) if self.kind == "LayerNorm" else None
        self.fc1_weight = _param(fc1_out, h, device=device, dtype=dtype)
        self.fc1_bias = _param(fc1_out, device=device, dtype=dtype) if spec.mlp_bias else None
        self.fc2_weight = _param(h, f, device=device, dtype=dtype)
        self.fc2_bias = _param(h, device=device, dtype=dtype) if spec.mlp_bias else None
        self.fc1, self.fc2 = FP8Gemm(), FP8Gemm()  # separate scaling state per GEMM

    def forward(self, x):
        y = self.fc1.gemm(_norm(x, self.layer_norm_weight, self.layer_norm_bias, self.kind, self.eps),
                          self.fc1_weight, self.fc1_bias)
        if self.act == "swiglu":
            gate, up = y.chunk(2, dim=-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y, approximate="tanh")
        return self.fc2.gemm(y, self.fc2_weight, self.fc2_bias)


class EmuAttention(nn.Module):
    """Twin of te.DotProductAttention (bshd in, [b, s, h*d] out): causal, GQA, sliding window,
    explicit softmax scale. Attention stays in high precision, as TE's default (no FP8 DPA)."""

    def __init__(self, spec: _fused.FusedSpec, window: int | None):
        super().__init__()
        self.scale, self.window, self.groups = spec.softmax_scale, window, spec.heads // spec.kv_heads

    def forward(self, q, k, v):
        b, t, h, d = q.shape
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        if self.groups > 1:
            k, v = k.repeat_interleave(self.groups, 1), v.repeat_interleave(self.groups, 1)
        i = torch.arange(t, device=q.device)
        allowed = i[:, None] >= i[None, :]
        if self.window is not None:
            allowed &= (i[:, None] - i[None, :]) < self.window
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=self.scale)
        return o.transpose(1, 2).reshape(b, t, h * d)


class EmulatedParts:
    """Builds the fused pieces (see ``_fused.Parts``) from the emulated modules above."""

    def __init__(self, device=None, dtype=None):
        self.kw = {"device": device, "dtype": dtype}

    def norm_linear(self, spec, out_features, bias=None):
        return EmuLayerNormLinear(spec, out_features, bias, **self.kw)

    def linear(self, spec, in_features, out_features, bias):
        return EmuLinear(in_features, out_features, bias=bias, **self.kw)

    def norm_mlp(self, spec):
        return EmuLayerNormMLP(spec, **self.kw)

    def attention(self, spec, window, layer_number):
        return EmuAttention(spec, window)

    def norm(self, spec):
        return EmuNorm(spec, **self.kw)

    def high_precision(self):
        return _region(False, None)


@contextmanager
def _region(enabled: bool, recipe: Recipe | None) -> Iterator[None]:
    token = _REGION.set(_Region(enabled, recipe))
    try:
        yield
    finally:
        _REGION.reset(token)


def _to_emulinear(lin: nn.Linear) -> EmuLinear:
    new = EmuLinear(lin.in_features, lin.out_features, bias=lin.bias is not None, device="meta")
    new.weight = lin.weight  # the very same Parameter objects: nothing is copied
    new.bias = lin.bias
    return new


class EmulatedBackend:
    name = "emulated"
    default_recipe = DEFAULT_RECIPES["emulated"]

    def available(self) -> str | None:
        return None  # pure PyTorch: any device

    def convert(self, model, recipe, *, fuse, module_filter):
        if fuse:
            fused_targets(model, module_filter)
            p = next(model.parameters())
            return _fused.build_fused(model, EmulatedParts(p.device, p.dtype), self.name, block_filter=module_filter)
        targets = dict(linear_targets(model, module_filter))
        swapped = swap_modules(model, lambda fqn, m: _to_emulinear(m) if fqn in targets else None)
        model.__dict__["_fp8lab_swapped"] = tuple(swapped)  # plain attribute: which layers run in FP8
        return model

    def autocast(self, recipe: Recipe, enabled: bool = True):
        return _region(enabled, recipe)

    @staticmethod
    def fp8_linear(lin: nn.Linear) -> nn.Module:
        """``lin`` as a layer whose GEMM runs in FP8 inside autocast, holding the same parameters
        (``--fp8-lm-head``)."""
        return _to_emulinear(lin)


BACKEND = EmulatedBackend()
