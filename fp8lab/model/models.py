"""Named Llama-2 / GPT-Neo shapes built as real ``transformers`` models with random weights.

The tutorial converts the classes people already use (``LlamaForCausalLM``,
``GPTNeoForCausalLM``); nothing is downloaded, every model is built from a config.
Parameter counts and FLOPs come from the config alone, so a 7B model can be
described (and planned for) without allocating 28 GB.

    >>> from fp8lab.model.models import build_model, list_models
    >>> model = build_model("llama-tiny", num_layers=4)     # float32, CPU, seed 0
    >>> big = build_model("llama-7b", device="meta")        # shapes only, no memory
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

# the architecture as data lives in fp8lab.model.config; these names stay importable from here
from fp8lab.model.config import (  # noqa: F401 - re-exported
    FAMILIES, FROM_CONFIG_ONLY, MODEL_CONFIGS, ModelConfig, config_from_hf, default_dtype, init_from_config,
    to_hf_config, validate_config,
)
from fp8lab.model import user as user_model


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The named config with ``overrides`` applied and validated (ValueError names what is wrong).

    ``name`` may also be a user's model folder or ``hf:<repo id>`` (see ``fp8lab.model.user``): its
    ``config.json`` is read (nothing is built) and overrides are refused (edit the config instead)."""
    if user_model.is_user_model(name):
        if overrides:
            raise ValueError(f"model overrides ({', '.join(sorted(overrides))}) apply to the named models only; "
                             f"for the model folder {name!r} edit its config.json instead")
        return user_model.model_config(name)
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}; choose from: {', '.join(MODEL_CONFIGS)}, "
                         f"a model folder (config.json + optional *.safetensors) or hf:<repo id>")
    base = MODEL_CONFIGS[name]
    valid = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in ("family", *FROM_CONFIG_ONLY)]
    unknown = sorted(set(overrides) - set(valid))
    if unknown:
        raise ValueError(f"unknown override(s) {', '.join(unknown)} for model {name!r}; valid overrides: "
                         f"{', '.join(valid)}")
    cfg = dataclasses.replace(base, **overrides)
    validate_config(cfg, name)
    return cfg


def sequence_overrides(name: str, overrides: dict, seq_len: Any) -> dict:
    """The overrides the named shape ``name`` is built with for sequences of ``seq_len`` tokens.

    A named Llama shape is always trained from scratch (random weights) and RoPE has no position
    table, so its ``max_seq_len`` is no limit: a longer ``seq_len`` raises it and nothing else changes.
    GPT-Neo is not raised: it learns a table of ``max_seq_len`` position embeddings, so a longer
    sequence means a bigger model (``--model-override max_seq_len=N`` asks for that explicitly;
    ``fp8lab.plan.config`` refuses it otherwise, naming why). An explicit ``max_seq_len`` override is kept, and
    a user's model folder is never changed (its weights were trained up to its ``max_position_embeddings``)."""
    base = MODEL_CONFIGS.get(name)
    if (base is None or base.family != "llama" or "max_seq_len" in overrides or isinstance(seq_len, bool)
            or not isinstance(seq_len, int) or seq_len <= base.max_seq_len):
        return dict(overrides)
    return {**overrides, "max_seq_len": seq_len}


def longer_sequence_note(name: str, overrides: dict, seq_len: Any) -> str | None:
    """One line for the run's first lines when :func:`sequence_overrides` raised ``max_seq_len`` (else None)."""
    if sequence_overrides(name, overrides, seq_len) == dict(overrides):
        return None
    return (f"{name} at {seq_len}: trained from scratch, max_seq_len raised from {MODEL_CONFIGS[name].max_seq_len} "
            f"(RoPE has no learned position table: nothing else changes)")


def build_model(name: str, *, device: Any = None, dtype: Any = None, seed: int | None = 0,
                config: ModelConfig | None = None, **overrides: Any):
    """A ``LlamaForCausalLM`` / ``GPTNeoForCausalLM`` with random weights for the named config (a user's
    folder: its own class, e.g. ``Qwen2ForCausalLM``, with its weights when it has them).

    ``device="meta"`` builds shapes only (for counting or planning a 7B model); ``dtype`` creates
    the parameters in that float type directly. ``seed`` makes the weights reproducible without
    touching the global RNG (None: use it). Overrides are ``ModelConfig`` fields; ``config``: the
    named shape's ModelConfig already made (a run's plan, ``RunPlan.model_config``) instead of them.
    """
    import torch

    if config is not None and overrides:
        raise ValueError("build_model: pass either config or ModelConfig overrides, not both")
    cfg = config if config is not None else get_config(name, **overrides)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise ValueError(f"dtype must be a floating torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    if name not in MODEL_CONFIGS:  # a user's folder: its own config, its weights when it has them
        return user_model.build(name, device=device, dtype=dtype, seed=seed)
    hf_cfg = to_hf_config(cfg)
    if cfg.family == "llama":
        from transformers import LlamaForCausalLM as cls
    else:
        from transformers import GPTNeoForCausalLM as cls
    dev = torch.device(device) if device is not None else torch.device("cpu")
    model = init_from_config(cls, hf_cfg, dev, dtype, seed)
    model.fp8lab_name = name  # lets notebooks and reports say which named shape this is
    return model.eval() if dev.type == "meta" else model


def _config_of(model_or_config) -> ModelConfig:
    """Our ``ModelConfig`` from a ModelConfig, a named model, an HF config or an HF model."""
    if isinstance(model_or_config, ModelConfig):
        return model_or_config
    if isinstance(model_or_config, str):
        return get_config(model_or_config)
    return config_from_hf(getattr(model_or_config, "config", model_or_config))


def layer_windows(cfg: ModelConfig) -> list[int | None]:
    """Per layer, the attention window (None: every earlier key)."""
    if cfg.family == "llama":
        return list(cfg.layer_windows or (None,) * cfg.num_layers)
    return [None if i % 2 == 0 else cfg.window_size for i in range(cfg.num_layers)]


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by role, computed from the config (no model is built)."""

    embedding: int  # token (+ learned position) embeddings: table look-ups, no matmul
    blocks: int  # all decoder blocks
    final_norm: int
    lm_head: int  # untied output projection (0 when tied to the embedding, as in GPT-Neo)
    total: int  # unique parameters, as sum(p.numel() for p in model.parameters())
    matmul: int  # parameters used in a matmul per token: blocks + final norm + LM head (tied or not)


def count_parameters(model_or_config) -> ParamCounts:
    """Parameter counts by role from the architecture alone (a 7B model costs nothing to count)."""
    c = _config_of(model_or_config)
    h, f, v, L = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_layers
    if c.family == "llama":
        q_dim, kv_dim = c.num_heads * c.head_dim, c.kv_heads * c.head_dim
        biases = (q_dim + 2 * kv_dim) * c.qkv_bias + h * c.out_bias + (2 * f + h) * c.mlp_bias
        block = block_matmul_params(c) + 2 * h + biases  # q,k,v,o + gate,up,down + two RMSNorm weights (+ biases)
        emb, final, head, head_matmul = v * h, h, (0 if c.tied else v * h), v * h
    else:
        # q,k,v,o, c_fc, c_proj; out_proj, c_fc, c_proj biases; 2 LayerNorms
        block = block_matmul_params(c) + h + f + h + 4 * h
        emb, final, head, head_matmul = v * h + c.max_seq_len * h, 2 * h, (0 if c.tied else v * h), v * h
    blocks = L * block
    return ParamCounts(emb, blocks, final, head, emb + blocks + final + head, blocks + final + head_matmul)


def block_matmul_params(model_or_config) -> int:
    """Weights of one decoder block that take part in a GEMM (Q, K, V, O and the MLP): what FP8 casts."""
    c = _config_of(model_or_config)
    h, f = c.hidden_size, c.intermediate_size
    if c.family == "llama":
        q_dim, kv_dim = c.num_heads * c.head_dim, c.kv_heads * c.head_dim
        return 2 * h * q_dim + 2 * h * kv_dim + 3 * h * f
    return 4 * h * h + 2 * h * f


def model_flops_per_token(model_or_config, seq_len: int, trainable: int | None = None) -> float:
    """Training FLOPs per token (forward + backward) for MFU, PaLM / nanoGPT convention.

        flops_per_token = 6 * N + 12 * sum_over_layers(n_heads * head_dim * T_l)

    * ``N`` = parameters that take part in a matmul per token: every decoder block, the final norm
      and the LM head (counted even when tied to the embedding, since the output projection is a
      real GEMM). Token and position embeddings are excluded: they are look-ups, not matmuls.
      6 = 2 (multiply-add) x 3 (forward, grad wrt input, grad wrt weight).
    * The attention term counts QK^T and AV (2 matmuls x 2 FLOPs x 3 passes = 12) over ``T_l``
      keys: ``T_l = seq_len`` on global layers (as PaLM; causal masking is not discounted) and
      ``min(seq_len, window)`` on GPT-Neo's local layers and Mistral's / Qwen2's sliding-window layers. Query heads
      count, so GQA does not reduce it.
    * ``trainable``: a frozen base training only this many added parameters (LoRA's adapters): the base's GEMMs run
      forward and for the input gradient only (4 per parameter), the added ones all three passes (6).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    c = _config_of(model_or_config)
    n = count_parameters(c).matmul
    attn = 0
    for w in layer_windows(c):
        t = min(seq_len, w) if w else seq_len
        attn += 12 * c.num_heads * c.head_dim * t
    return float((6 * n if trainable is None else 4 * n + 6 * trainable) + attn)


def list_models() -> list[dict[str, Any]]:
    """The named models with their shapes and parameter counts (computed, nothing is built)."""
    rows = []
    for name, c in MODEL_CONFIGS.items():
        pc = count_parameters(c)
        rows.append({
            "name": name, "family": c.family, "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_layers": c.num_layers, "num_heads": c.num_heads,
            "num_kv_heads": c.kv_heads, "vocab_size": c.vocab_size, "max_seq_len": c.max_seq_len,
            "window_size": c.window_size, "params": pc.total, "params_non_embedding": pc.total - pc.embedding,
        })
    return rows
