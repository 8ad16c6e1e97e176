"""NVIDIA Transformer Engine: real FP8 GEMMs on Ada/Hopper/Blackwell GPUs.

Two levels, because the difference is part of the lesson:

* ``fuse=False``: module for module, in place, as the source blog does: ``nn.Linear`` ->
  ``te.Linear``, RMSNorm -> ``te.RMSNorm``, ``nn.LayerNorm`` -> ``te.LayerNorm``. HF's attention,
  RoPE and residual code keep running; each projection is its own FP8 GEMM.
* ``fuse=True``: each decoder block -> ``te.LayerNormLinear`` (norm + one QKV GEMM) +
  ``te.DotProductAttention`` (fused attention kernels; GQA; GPT-Neo's local layers and Mistral's /
  Qwen2's sliding windows as ``window_size=(w-1, 0)``; GPT-Neo's unscaled scores as
  ``softmax_scale=1.0``, yarn/longrope's attention scaling folded into it) + ``te.Linear`` +
  ``te.LayerNormMLP`` (norm + fc1 [gate; up] + SwiGLU / GELU + fc2). Built by fp8lab from the
  HF config (``_fused``), never by patching ``transformers``.

The model must already be on the CUDA device (``model.to("cuda")``); TE builds its modules there.
"""
from __future__ import annotations

import importlib.util
from collections import Counter
import warnings

import torch
from torch import nn

from fp8lab.fp8 import fused as _fused
from fp8lab.fp8.backends import (DEFAULT_RECIPES, fused_targets, install_or_gpu_problem, is_rmsnorm, linear_targets,
                                 swap_modules)
from fp8lab.core.pins import install_hint
from fp8lab.fp8.recipe import Recipe, kinds_where

# A known-harmless warning of TE's import, silenced by its message and the module that raises it (no
# other warning is touched): TE's __init__ warns when Jax is installed but TE's Jax extension is not,
# which a PyTorch user does not need (seen on the H200 image, which ships Jax).
JAX_WARNING = r"Detected a Jax installation but could not find the shared object file for the Transformer Engine Jax"
warnings.filterwarnings("ignore", message=JAX_WARNING, category=RuntimeWarning, module=r"transformer_engine")



def _te():
    import transformer_engine.pytorch as te

    return te


class TERope(_fused.TorchRope):
    """RoPE through TE's fused kernel (one kernel each way instead of ~6 elementwise ops).

    Same rotate-half layout as HF Llama; the angles are computed in fp32 like ``TorchRope``'s.
    """

    def tables(self, seq_len, head_dim, theta, device, dtype):
        return _fused.rope_angles(seq_len, head_dim, theta, device)[:, None, None, :].contiguous()  # [s, 1, 1, d] fp32

    def apply(self, x, tables):
        from transformer_engine.pytorch.attention.rope import apply_rotary_pos_emb

        return apply_rotary_pos_emb(x, tables, tensor_format="bshd", fused=True)


class TESwiGLU(torch.autograd.Function):
    """SwiGLU of ``[gate, up]`` through TE's kernels, the ones its LayerNormMLP runs: one pass over fc1's output
    forward and one backward, fp32 math inside, and only fc1's output kept for backward (the plain-PyTorch
    ``_fused.SwiGLU`` runs three kernels each way and keeps ``silu(gate)`` as well)."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        import transformer_engine_torch as tex

        y = y.contiguous()
        ctx.save_for_backward(y)
        return tex.swiglu(y, None)

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> torch.Tensor:
        import transformer_engine_torch as tex

        (y,) = ctx.saved_tensors
        return tex.dswiglu(dh.contiguous(), y, None)


class TEParts:
    """The fused pieces (``_fused.Parts``) as Transformer Engine modules."""

    weight_cache = True  # TE modules take is_first_microbatch: FP8 weights cast once per optimizer step
    rope = TERope()
    swiglu = staticmethod(TESwiGLU.apply)  # a split MLP's (LoRA on the MLP) activation: LayerNormMLP's kernels

    @staticmethod
    def release_weight_cache(model: nn.Module) -> None:
        """Drop each TE module's cached FP8 weights (its ``_fp8_workspaces``)."""
        for m in model.modules():
            ws = getattr(m, "_fp8_workspaces", None)
            if isinstance(ws, dict):
                ws.clear()

    @staticmethod
    def wgrad_into_main_grad(model: nn.Module) -> list[nn.Parameter]:
        """Make TE's weight-gradient GEMMs add into each weight's ``main_grad``; return those weights.

        Why: under gradient accumulation autograd otherwise writes each micro-batch's weight gradient
        to a new tensor and adds it to ``.grad`` (one extra read and write of every weight gradient
        per micro-batch); here the GEMM accumulates in place (cuBLAS beta = 1). The caller owns
        the buffers: it must give each returned weight a ``main_grad`` before backward. TE then
        leaves ``.grad`` empty for them. ``is_first_microbatch=True`` overwrites instead of adding.
        """
        te = _te()
        weights: list[nn.Parameter] = []
        # a weight two modules hold (a tied LM head in FP8, --fp8-lm-head) also gets the embedding's .grad: not fused
        owners = Counter(id(p) for m in model.modules() for p in m.parameters(recurse=False))
        for m in model.modules():
            if any(owners[id(p)] > 1 for p in m.parameters(recurse=False)):
                continue
            if isinstance(m, te.LayerNormMLP):
                names = ("fc1_weight", "fc2_weight")
            elif isinstance(m, (te.LayerNormLinear, te.Linear)):
                names = ("weight",)
            else:
                continue
            m.fuse_wgrad_accumulation = True  # read at every forward
            weights += [getattr(m, n) for n in names if getattr(m, n).requires_grad]
        return weights

    def __init__(self, device, dtype):
        self.device, self.dtype = device, dtype

    def norm_linear(self, spec, out_features, bias=None):
        return _te().LayerNormLinear(spec.hidden, out_features, eps=spec.eps,
                                     bias=spec.qkv_bias if bias is None else bias,
                                     normalization=spec.normalization, params_dtype=self.dtype, device=self.device)

    def linear(self, spec, in_features, out_features, bias):
        return _te().Linear(in_features, out_features, bias=bias, params_dtype=self.dtype, device=self.device)

    def norm_mlp(self, spec):
        return _te().LayerNormMLP(spec.hidden, spec.ffn, eps=spec.eps, bias=spec.mlp_bias,
                                  normalization=spec.normalization,
                                  activation=spec.activation, params_dtype=self.dtype, device=self.device)

    def attention(self, spec, window, layer_number):
        return _te().DotProductAttention(
            spec.heads, spec.head_dim, num_gqa_groups=spec.kv_heads, attention_dropout=0.0, qkv_format="bshd",
            attn_mask_type="causal", window_size=(window - 1, 0) if window else None,
            softmax_scale=spec.softmax_scale, layer_number=layer_number,
        )

    def norm(self, spec):
        cls = _te().RMSNorm if spec.normalization == "RMSNorm" else _te().LayerNorm
        return cls(spec.hidden, eps=spec.eps, dtype=self.dtype, device=self.device)

    def high_precision(self):
        return _te().autocast(enabled=False)


def _copy_into(new: nn.Module, old: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, p in old.named_parameters(recurse=False):
            getattr(new, name).copy_(p)
    return new


class TEBackend:
    name = "te"
    default_recipe = DEFAULT_RECIPES["te"]

    def __init__(self) -> None:
        # one TE recipe object per Recipe: TE re-initialises a module's FP8 state (its amax
        # history) when the recipe it sees differs from the last one, so reuse the same object
        self._te_recipes: dict[Recipe, object] = {}

    def te_recipe(self, recipe: Recipe):
        if recipe not in self._te_recipes:
            self._te_recipes[recipe] = recipe.to_te()
        return self._te_recipes[recipe]

    def available(self) -> str | None:
        problem = install_or_gpu_problem("transformer_engine", "Transformer Engine", install_hint())
        if problem is not None:
            return problem
        try:
            te = _te()
            ok, reason = te.is_fp8_available(return_reason=True)
        except Exception as exc:  # a broken install must not break available_backends()
            return f"Transformer Engine does not import: {type(exc).__name__}: {exc}"
        return None if ok else f"Transformer Engine reports no FP8 support: {reason}"

    def check_recipe(self, recipe: Recipe) -> None:
        """Refuse recipes this GPU cannot run (e.g. MXFP8 before Blackwell), naming the GPU."""
        check = recipe.row.te_check  # the kind's TE availability function, by name (fp8lab.fp8.recipe.TABLE)
        if check is not None:
            ok, reason = getattr(_te(), check)(return_reason=True)
            if not ok:
                cc = ".".join(map(str, torch.cuda.get_device_capability()))
                anywhere = " or ".join(repr(k)
                                       for k in kinds_where(lambda r: r.te_check is None and r.te_class is not None))
                raise ValueError(
                    f"Recipe(kind={recipe.kind!r}) is not supported on {torch.cuda.get_device_name()} "
                    f"(compute capability {cc}): {reason}. Use kind={anywhere}"
                )
        self.te_recipe(recipe)  # raises for combinations TE has no equivalent of

    @staticmethod
    def fp8_linear(lin: nn.Linear) -> nn.Module:
        """``lin`` as TE's Linear (an FP8 GEMM inside autocast) holding the very same parameters, so a head tied
        to the embedding stays tied (``--fp8-lm-head``)."""
        new = _te().Linear(lin.in_features, lin.out_features, bias=lin.bias is not None,
                           params_dtype=lin.weight.dtype, device=lin.weight.device)
        new.weight = lin.weight
        if lin.bias is not None:
            new.bias = lin.bias
        return new

    def convert(self, model, recipe, *, fuse, module_filter):
        self.check_recipe(recipe)
        p = next(model.parameters())
        if p.device.type != "cuda":
            raise ValueError(f"the te backend builds its modules on the GPU: move the model first "
                             f"(model.to('cuda')); it is on {p.device}")
        te = _te()
        if fuse:
            fused_targets(model, module_filter)
            return _fused.build_fused(model, TEParts(p.device, p.dtype), self.name, block_filter=module_filter)
        targets = dict(linear_targets(model, module_filter))
        linears: list[str] = []

        def make(fqn: str, m: nn.Module):
            dt, dev = ((m.weight.dtype, m.weight.device) if isinstance(getattr(m, "weight", None), torch.Tensor)
                       else (None, None))
            if fqn in targets:
                linears.append(fqn)
                return _copy_into(te.Linear(m.in_features, m.out_features, bias=m.bias is not None,
                                            params_dtype=dt, device=dev), m)
            if is_rmsnorm(m):
                return _copy_into(te.RMSNorm(m.weight.shape[0], eps=m.variance_epsilon, dtype=dt, device=dev), m)
            if type(m) is nn.LayerNorm:
                return _copy_into(te.LayerNorm(m.normalized_shape[0], eps=m.eps, dtype=dt, device=dev), m)
            return None

        swap_modules(model, make)
        model.__dict__["_fp8lab_swapped"] = tuple(linears)
        return model

    def autocast(self, recipe: Recipe, enabled: bool = True):
        if not enabled:
            return _te().autocast(enabled=False) if importlib.util.find_spec("transformer_engine") else _Null()
        self.check_recipe(recipe)
        return _te().autocast(enabled=True, recipe=self.te_recipe(recipe))


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


BACKEND = TEBackend()
