"""The decoder blocks' weights kept only in FP8 (``--fp8-weights primary``; the rule: fp8lab.plan.fp8_weights).

After the master weights exist (fp8lab.train.master_weights, their fp32 masters in host memory under ``--memory
offload``), each 2-d weight of a Transformer Engine module inside the decoder blocks is replaced by an FP8 tensor
(TE's ``Float8Tensor``: one byte per weight, rowwise data only, a per-tensor scale from the weight's own amax) made
from the bf16 weight, which is then freed. TE's modules take such a weight as it is: the forward's GEMM reads it,
and the backward makes its transpose (``update_usage(columnwise_usage=True)``) for the input gradient.
:func:`drop_transposes` frees those after each backward, so they exist only while the activations they replace are
being freed.

The optimizer writes each stepped master back through ``quantize_`` from its bf16 rounding, so the FP8 values are
the ones a bf16 weight cast under current scaling would give.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn


def is_te_module(module: nn.Module) -> bool:
    """A Transformer Engine module (its linears take an FP8 tensor as their weight)."""
    return type(module).__module__.startswith("transformer_engine.")


def block_weights(blocks: list[nn.Module], owns: Callable[[nn.Module], bool] | None = None
                  ) -> list[tuple[nn.Module, str]]:
    """(module, parameter name) of every trainable 2-d weight held directly by a module ``owns`` accepts (default:
    :func:`is_te_module`) inside ``blocks`` (norm weights are 1-d; biases too)."""
    owns = owns or is_te_module
    found = []
    for block in blocks:
        for module in block.modules():
            if owns(module):
                found += [(module, name) for name, p in module.named_parameters(recurse=False)
                          if p.dim() == 2 and p.requires_grad]
    return found


def te_quantizer(recipe) -> Callable[[torch.Tensor], torch.Tensor]:
    """TE's current-scaling E4M3 quantizer, rowwise only (the forward's layout; backward makes the transpose), with
    the recipe's weight settings where it has them (power-of-two scales, amax epsilon)."""
    # (TE is imported only where it runs: a GPU with Transformer Engine)
    import transformer_engine_torch as tex
    from transformer_engine.pytorch.tensor import Float8CurrentScalingQuantizer

    params = getattr(recipe, "fp8_quant_fwd_weight", None)
    kw = {} if params is None else {"force_pow_2_scales": bool(getattr(params, "power_2_scale", False)),
                                     "amax_epsilon": float(getattr(params, "amax_epsilon", 0.0))}

    def quantize(weight: torch.Tensor) -> torch.Tensor:
        q = Float8CurrentScalingQuantizer(tex.DType.kFloat8E4M3, weight.device, rowwise=True, columnwise=False, **kw)
        q.internal = False  # a Float8Tensor (a torch.Tensor a Parameter can wrap), not TE's bare storage
        return q(weight)

    return quantize


@torch.no_grad()
def make_primary(weights: list[tuple[nn.Module, str]], master, quantize: Callable[[torch.Tensor], torch.Tensor]
                 ) -> list[nn.Parameter]:
    """Replace each (module, name) weight by an FP8 parameter made by ``quantize`` from it, one at a time (the bf16
    weight is freed as its module and ``master`` let go of it); ``master`` (MasterWeights) writes its steps into
    the new parameters. Returns them."""
    made = []
    for module, name in weights:
        old = getattr(module, name)
        new = nn.Parameter(quantize(old.detach()), requires_grad=True)
        module.register_parameter(name, new)
        master.replace_param(old, new)
        made.append(new)
    return made


def drop_transposes(params: list[nn.Parameter]) -> None:
    """Free the transposes the last backward made of these FP8 weights (the next forward needs only their rows)."""
    for p in params:
        p.update_usage(columnwise_usage=False)
