"""RoPE of a Hugging Face config, computed by transformers itself (never re-derived here).

A Llama-family config may carry a RoPE variant (``rope_parameters`` in transformers 5, ``rope_scaling``
in 4): ``default`` (rope_theta only), ``linear``, ``dynamic`` (NTK), ``yarn``, ``longrope``, ``llama3``
(Llama 3.1+). Each is a table of inverse frequencies plus an ``attention_scaling`` (yarn's and
longrope's mscale, 1 for the others). ``HFRope`` builds the model's own rotary-embedding class from
the config and asks it, for a sequence length, which frequencies its forward would use: transformers'
``dynamic`` and ``longrope`` pick them by sequence length, so the answer is per length, fixed for
a training run at one length.

``attention_scaling`` multiplies HF's cos and sin, so queries and keys each by m and the attention
scores by m^2: the fused blocks apply plain rotations with the same frequencies and fold m^2 into
the softmax scale (the same product, one multiply instead of four).
"""
from __future__ import annotations

from typing import Any

import torch


def rope_parameters(c: Any) -> dict:
    """The config's RoPE dict (transformers 5 ``rope_parameters``, 4 ``rope_scaling``), {} when none."""
    rp = getattr(c, "rope_parameters", None)
    if rp is None:
        rp = getattr(c, "rope_scaling", None)
    return dict(rp or {})


def rope_type(c: Any) -> str:
    rp = rope_parameters(c)
    return rp.get("rope_type", rp.get("type", "default")) or "default"


def known_types() -> list[str]:
    """RoPE types the installed transformers implements ('default' plus its ROPE_INIT_FUNCTIONS)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    return ["default", *ROPE_INIT_FUNCTIONS]


def rope_problem(c: Any) -> str | None:
    """Why transformers' RoPE for config ``c`` is not a full-width rotation table fp8lab can apply, or None."""
    rp = rope_parameters(c)
    if any(isinstance(v, dict) for v in rp.values()):
        return ("per-layer-type RoPE parameters (a dict per attention type) are not supported; one RoPE for all layers "
                "is")
    kind = rope_type(c)
    allowed = known_types()
    if kind not in allowed:
        return f"rope_type={kind!r} is not a RoPE type transformers implements; allowed: {', '.join(allowed)}"
    return None


class HFRope:
    """transformers' RoPE for one config: ``inv_freq(seq_len)`` and ``attention_scaling``.

    ``rotary_cls`` is the model's rotary-embedding class (e.g. ``type(model.model.rotary_emb)``); it is
    built once from the config on the CPU in fp32 and kept out of any module tree (no state, no cast).
    """

    def __init__(self, rotary_cls: type, config: Any):
        problem = rope_problem(config)
        if problem:
            raise ValueError(problem)
        with torch.device("cpu"):
            self._rot = rotary_cls(config=config).float()  # keyword: transformers 4 took dim first
        self.rope_type = rope_type(config)
        self.attention_scaling = float(self._rot.attention_scaling)
        self.half = int(self._rot.inv_freq.numel())

    @torch.no_grad()
    def inv_freq(self, seq_len: int) -> torch.Tensor:
        """The fp32 inverse frequencies transformers' forward uses for positions 0..seq_len-1."""
        self._rot(torch.zeros(1), torch.arange(seq_len)[None])  # runs its dynamic/longrope update, if any
        if float(self._rot.attention_scaling) != self.attention_scaling:
            raise ValueError(f"RoPE {self.rope_type!r}: attention scaling changes with the sequence length "
                             f"({self.attention_scaling} -> {float(self._rot.attention_scaling)} at {seq_len} tokens)")
        return self._rot.inv_freq.detach().float().clone()
