"""The Hugging Face model families fp8lab converts, and what sets the others apart.

One table (``SUPPORTED``) says which transformers ``model_type`` values fp8lab trains and which HF
class builds each; ``DIFFERENT`` names, for families people often bring, what their blocks have that
fp8lab's decoder (pre-norm RMSNorm/LayerNorm, one attention, one dense MLP) does not. Everything else
derives from these: the refusal message, the class a folder is built with, the fused decoder's
family. Refusals happen on the config alone, before any model is built or any code of the folder runs.

Llama, Mistral and Qwen2 share one decoder shape (``layout="llama"``: RMSNorm, SwiGLU, RoPE, GQA);
they differ in data the fused blocks take as parameters: Qwen2's Q/K/V biases, Mistral's and
Qwen2's sliding windows, the RoPE variant of the config (``fp8lab.model.rope``).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    model_type: str  # transformers' config.model_type
    hf_class: str  # the transformers class that builds it (AutoModelForCausalLM's choice)
    label: str  # for people
    # fp8lab's decoder shape: "llama" (RMSNorm, SwiGLU, RoPE) | "gptneo" (LayerNorm, GELU, learned positions)
    layout: str


SUPPORTED: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", "LlamaForCausalLM", "Llama 2 / Llama 3.x", "llama"),
    Family("mistral", "MistralForCausalLM", "Mistral", "llama"),
    Family("qwen2", "Qwen2ForCausalLM", "Qwen2 / Qwen2.5", "llama"),
    Family("gpt_neo", "GPTNeoForCausalLM", "GPT-Neo", "gptneo"),
)}

# Each layout's projections by HF module name, attention then MLP, and where the fused decoder (fp8lab.fp8.fused)
# computes each: (its GEMM there, which of the GEMM's concatenated row blocks; None: all of it). LoRA's targets are
# these names, and its adapters on the fused blocks add their output there.
PROJECTIONS: dict[str, dict[str, tuple[str, int | None]]] = {
    "llama": {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("proj", None),
              "gate_proj": ("fc1", 0), "up_proj": ("fc1", 1), "down_proj": ("fc2", None)},
    "gptneo": {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "out_proj": ("proj", None),
               "c_fc": ("fc1", None), "c_proj": ("fc2", None)},
}

_MOE = "a mixture of experts (a router and many expert MLPs per block); fp8lab's blocks have one dense MLP"
_GEMMA = ("embeddings scaled by sqrt(hidden_size), RMSNorm weights applied as (1 + w) and a GELU-gated MLP, "
          "none of which fp8lab's decoder has")
DIFFERENT: dict[str, str] = {
    "gemma": _GEMMA,
    "gemma2": _GEMMA + "; also logit soft-capping and extra norms after attention and MLP",
    "gemma3": _GEMMA + "; also per-head Q/K norms and interleaved local/global RoPE bases",
    "gemma3_text": _GEMMA + "; also per-head Q/K norms and interleaved local/global RoPE bases",
    "phi": "attention and MLP in parallel from one LayerNorm, partial rotary embeddings and biases everywhere",
    "phi3": "Q/K/V and gate/up stored as single fused weights (qkv_proj, gate_up_proj), another weight layout",
    "qwen3": "per-head RMSNorm on queries and keys (q_norm, k_norm), which fp8lab's attention has not",
    "mixtral": _MOE,
    "qwen2_moe": _MOE + " (plus a shared expert)",
    "qwen3_moe": _MOE,
    "deepseek_v2": _MOE + "; also multi-head latent attention",
    "deepseek_v3": _MOE + "; also multi-head latent attention",
}


def supported_list() -> str:
    return ", ".join(f"{k} ({f.hf_class}: {f.label})" for k, f in SUPPORTED.items())


def unsupported_reason(model_type, where: str = "config.json") -> str:
    """One line: this model_type is not supported, what makes it different (when known), the list."""
    why = DIFFERENT.get(model_type)
    what = f"; it differs by {why}" if why else ""
    return (f"--model: {where} has model_type={model_type!r}, which fp8lab does not support{what}; supported: "
            f"{supported_list()}")


def family_of(model_type) -> Family:
    """The family of a supported model_type, else a ValueError with the reason and the list."""
    if model_type not in SUPPORTED:
        raise ValueError(unsupported_reason(model_type))
    return SUPPORTED[model_type]


def hf_class(model_type) -> type:
    """The transformers class for a supported model_type (imported by name from transformers)."""
    import transformers

    return getattr(transformers, family_of(model_type).hf_class)


def rotary_class(model_type) -> type:
    """The family's own rotary-embedding class (e.g. ``LlamaRotaryEmbedding``) from its transformers
    modelling module; for the llama layout only."""
    import importlib

    fam = family_of(model_type)
    module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    return getattr(module, fam.hf_class.removesuffix("ForCausalLM") + "RotaryEmbedding")


def layer_windows(c) -> tuple[int | None, ...]:
    """Per layer, the attention window of an HF config of the llama layout: None = full causal, w = the
    last w tokens (the token itself included), as transformers' sliding-window mask.

    Mistral: ``sliding_window`` on every layer (null: none). Qwen2: ``layer_types`` where the config
    has them ("sliding_attention" layers get ``sliding_window``), else the rule transformers applies:
    with ``use_sliding_window``, layers from ``max_window_layers`` on slide."""
    n, mt = c.num_hidden_layers, getattr(c, "model_type", None)
    w = getattr(c, "sliding_window", None)
    if mt == "mistral":
        return (w,) * n
    if mt == "qwen2":
        if not getattr(c, "use_sliding_window", False) or w is None:
            return (None,) * n
        types = getattr(c, "layer_types", None)
        if types:
            return tuple(w if t == "sliding_attention" else None for t in types)
        return tuple(w if i >= c.max_window_layers else None for i in range(n))
    return (None,) * n


def qkv_bias(c) -> bool:
    """Whether Q/K/V projections carry biases (Qwen2 always; Llama with attention_bias)."""
    return getattr(c, "model_type", None) == "qwen2" or bool(getattr(c, "attention_bias", False))


def out_bias(c) -> bool:
    """Whether the attention output projection has a bias (Llama's attention_bias; never Qwen2's)."""
    return getattr(c, "model_type", None) == "llama" and bool(getattr(c, "attention_bias", False))


def mlp_bias(c) -> bool:
    return getattr(c, "model_type", None) == "llama" and bool(getattr(c, "mlp_bias", False))
