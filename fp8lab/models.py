"""Named Llama-2 / GPT-Neo shapes built as real ``transformers`` models with random weights.

The tutorial converts the classes people already use (``LlamaForCausalLM``,
``GPTNeoForCausalLM``); nothing is downloaded, every model is built from a config.
Parameter counts and FLOPs come from the config alone, so a 7B model can be
described (and planned for) without allocating 28 GB.

    >>> from fp8lab.models import build_model, list_models
    >>> model = build_model("llama-tiny", num_layers=4)     # float32, CPU, seed 0
    >>> big = build_model("llama-7b", device="meta")        # shapes only, no memory
"""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

FAMILIES = ("llama", "gptneo")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one named model; the fields are what ``build_model`` overrides accept."""

    family: str  # "llama" (RMSNorm, SwiGLU, RoPE, GQA) or "gptneo" (LayerNorm, GELU, learned positions)
    hidden_size: int
    intermediate_size: int  # MLP width (Llama: SwiGLU gate/up width; GPT-Neo: 4 * hidden)
    num_layers: int
    num_heads: int
    vocab_size: int
    max_seq_len: int  # position table size (GPT-Neo) / RoPE range (Llama)
    num_kv_heads: int | None = None  # Llama only: grouped-query attention; None = num_heads
    window_size: int | None = None  # GPT-Neo only: local-attention window of the odd layers
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0  # Llama only
    attention_head_dim: int | None = None  # Llama only: per-head width; None = hidden_size / num_heads
    tie_embeddings: bool | None = None  # LM head shares the token embedding; None = family default (GPT-Neo tied, Llama not)
    # Llama layout only, read from a user's config.json (Mistral, Qwen2, Llama with biases); not overrides:
    qkv_bias: bool = False  # Q/K/V projections have biases (Qwen2; Llama attention_bias)
    out_bias: bool = False  # attention output projection has a bias (Llama attention_bias)
    mlp_bias: bool = False  # gate/up/down have biases (Llama mlp_bias)
    layer_windows: tuple[int | None, ...] | None = None  # per layer: sliding window (None = full causal); None = all full

    @property
    def head_dim(self) -> int:
        return self.attention_head_dim or self.hidden_size // self.num_heads

    @property
    def tied(self) -> bool:
        return self.family == "gptneo" if self.tie_embeddings is None else bool(self.tie_embeddings)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads


# Published shapes. The tiny ones keep every GEMM dimension a multiple of 16 (what FP8 GEMMs need)
# and are small enough for CPU tests; gptneo-tiny uses a 16-token window so that short test
# sequences actually exercise the local layers (the published GPT-Neo window is 256).
MODEL_CONFIGS: dict[str, ModelConfig] = {
    "llama-tiny": ModelConfig("llama", 64, 176, 2, 4, 512, 256, num_kv_heads=2, norm_eps=1e-6),
    # TinyLlama-1.1B: 22 layers, GQA with 4 KV heads
    "llama-1b": ModelConfig("llama", 2048, 5632, 22, 32, 32000, 2048, num_kv_heads=4, norm_eps=1e-5),
    # Llama-2-7B: full multi-head attention
    "llama-7b": ModelConfig("llama", 4096, 11008, 32, 32, 32000, 4096, num_kv_heads=32, norm_eps=1e-5),
    "gptneo-tiny": ModelConfig("gptneo", 64, 256, 2, 4, 512, 256, window_size=16),
    "gptneo-125m": ModelConfig("gptneo", 768, 3072, 12, 12, 50257, 2048, window_size=256),
    "gptneo-1.3b": ModelConfig("gptneo", 2048, 8192, 24, 16, 50257, 2048, window_size=256),
}

FROM_CONFIG_ONLY = ("qkv_bias", "out_bias", "mlp_bias", "layer_windows")  # a user's config.json sets them
_INT_FIELDS = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "vocab_size", "max_seq_len")


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """The named config with ``overrides`` applied and validated (ValueError names what is wrong).

    ``name`` may also be a user's model folder or ``hf:<repo id>`` (see ``fp8lab.user_model``): its
    ``config.json`` is read (nothing is built) and overrides are refused (edit the config instead)."""
    from fp8lab import user_model

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
        raise ValueError(f"unknown override(s) {', '.join(unknown)} for model {name!r}; valid overrides: {', '.join(valid)}")
    cfg = dataclasses.replace(base, **overrides)
    validate_config(cfg, name)
    return cfg


def sequence_overrides(name: str, overrides: dict, seq_len: Any) -> dict:
    """The overrides the named shape ``name`` is built with for sequences of ``seq_len`` tokens.

    A named Llama shape is always trained from scratch (random weights) and RoPE has no position
    table, so its ``max_seq_len`` is no limit: a longer ``seq_len`` raises it and nothing else changes.
    GPT-Neo is not raised: it learns a table of ``max_seq_len`` position embeddings, so a longer
    sequence means a bigger model (``--model-override max_seq_len=N`` asks for that explicitly;
    ``fp8lab.config`` refuses it otherwise, naming why). An explicit ``max_seq_len`` override is kept, and
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


def validate_config(cfg: ModelConfig, name: str = "model") -> None:
    """Reject configs the HF classes would build wrongly or that cannot run, before any allocation."""
    if cfg.family not in FAMILIES:
        raise ValueError(f"{name}: family must be one of {FAMILIES}, got {cfg.family!r}")
    for f in _INT_FIELDS:
        v = getattr(cfg, f)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {f} must be a positive integer, got {v!r}")
    hd = cfg.attention_head_dim
    if hd is not None and (isinstance(hd, bool) or not isinstance(hd, int) or hd < 1 or cfg.family != "llama"):
        raise ValueError(f"{name}: attention_head_dim applies to Llama only and must be a positive integer, got {hd!r}")
    if cfg.tie_embeddings not in (None, True, False):
        raise ValueError(f"{name}: tie_embeddings must be True, False or None, got {cfg.tie_embeddings!r}")
    if hd is None and cfg.hidden_size % cfg.num_heads:
        raise ValueError(f"{name}: hidden_size ({cfg.hidden_size}) must be divisible by num_heads ({cfg.num_heads})")
    if not (isinstance(cfg.norm_eps, (int, float)) and 0 < cfg.norm_eps < 1):
        raise ValueError(f"{name}: norm_eps must be in (0, 1), got {cfg.norm_eps!r}")
    if cfg.family == "llama":
        if cfg.window_size is not None:
            raise ValueError(f"{name}: window_size applies to GPT-Neo only (Llama uses full causal attention)")
        kv = cfg.num_kv_heads
        if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or cfg.num_heads % kv):
            raise ValueError(f"{name}: num_kv_heads must be a positive divisor of num_heads ({cfg.num_heads}), got {kv!r}")
        if cfg.head_dim % 2:
            raise ValueError(f"{name}: head_dim ({cfg.head_dim}) must be even for RoPE")
        if not cfg.rope_theta > 0:
            raise ValueError(f"{name}: rope_theta must be positive, got {cfg.rope_theta!r}")
        lw = cfg.layer_windows
        if lw is not None and (len(lw) != cfg.num_layers or any(
                w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1) for w in lw)):
            raise ValueError(f"{name}: sliding_window must be a positive integer or null, one per layer, got {lw!r}")
    else:
        if cfg.num_kv_heads not in (None, cfg.num_heads):
            raise ValueError(f"{name}: num_kv_heads applies to Llama only (GPT-Neo has one KV head per query head)")
        w = cfg.window_size
        if isinstance(w, bool) or not isinstance(w, int) or w < 1:
            raise ValueError(f"{name}: window_size must be a positive integer for GPT-Neo, got {w!r}")


def to_hf_config(cfg: ModelConfig):
    """The ``transformers`` config object for ``cfg`` (public constructor arguments only)."""
    if cfg.family == "llama":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
            num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
            num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.max_seq_len, head_dim=cfg.head_dim,
            rms_norm_eps=cfg.norm_eps, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
            tie_word_embeddings=cfg.tied,
        )
    from transformers import GPTNeoConfig

    # alternating global/local, as the published checkpoints; an odd last layer is global
    types: list = [[["global", "local"], cfg.num_layers // 2]]
    if cfg.num_layers % 2:
        types.append([["global"], 1])
    return GPTNeoConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_layers, num_heads=cfg.num_heads, attention_types=types,
        max_position_embeddings=cfg.max_seq_len, window_size=cfg.window_size,
        layer_norm_epsilon=cfg.norm_eps, embed_dropout=0.0, resid_dropout=0.0, attention_dropout=0.0,
        tie_word_embeddings=cfg.tied,
        # GPT-Neo's <|endoftext|> is the last token of its vocabulary; keep it inside smaller vocabularies
        bos_token_id=min(50256, cfg.vocab_size - 1), eos_token_id=min(50256, cfg.vocab_size - 1),
    )


@contextmanager
def default_dtype(dtype) -> Iterator[None]:
    """Create parameters directly in ``dtype`` (a 7B model in bf16 needs 14 GB, not 28 GB), then restore."""
    import torch

    old = torch.get_default_dtype()
    if dtype is not None:
        torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def build_model(name: str, *, device: Any = None, dtype: Any = None, seed: int | None = 0, **overrides: Any):
    """A ``LlamaForCausalLM`` / ``GPTNeoForCausalLM`` with random weights for the named config (a user's
    folder: its own class, e.g. ``Qwen2ForCausalLM``, with its weights when it has them).

    ``device="meta"`` builds shapes only (for counting or planning a 7B model); ``dtype`` creates
    the parameters in that float type directly. ``seed`` makes the weights reproducible without
    touching the global RNG (None: use it). Overrides are ``ModelConfig`` fields.
    """
    import torch

    from fp8lab import user_model

    cfg = get_config(name, **overrides)
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


def init_from_config(cls, hf_cfg, device, dtype=None, seed: int | None = 0):
    """``cls(hf_cfg)`` with random weights on ``device`` in ``dtype``, seeded without touching the
    caller's random state (the same weights for the same seed on any run)."""
    import torch

    devices = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices, enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        with default_dtype(dtype), device:
            return cls(hf_cfg)


def _config_of(model_or_config) -> ModelConfig:
    """Our ``ModelConfig`` from a ModelConfig, a named model, an HF config or an HF model."""
    if isinstance(model_or_config, ModelConfig):
        return model_or_config
    if isinstance(model_or_config, str):
        return get_config(model_or_config)
    return config_from_hf(getattr(model_or_config, "config", model_or_config))


def config_from_hf(c) -> ModelConfig:
    """Our ``ModelConfig`` for a transformers config of a supported family (``fp8lab.families``): the
    shape, biases and windows (FLOPs, memory plans and counts need nothing else; the RoPE variant is
    not represented, it changes no count)."""
    from fp8lab import families
    from fp8lab.rope import rope_parameters

    mt = getattr(c, "model_type", None)
    if mt in families.SUPPORTED and families.SUPPORTED[mt].layout == "llama":
        rp = rope_parameters(c)
        hd = getattr(c, "head_dim", None)
        windows = families.layer_windows(c)
        return ModelConfig(
            "llama", c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.vocab_size, c.max_position_embeddings, num_kv_heads=c.num_key_value_heads,
            norm_eps=c.rms_norm_eps, rope_theta=float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))),
            attention_head_dim=hd if hd and hd != c.hidden_size // c.num_attention_heads else None,
            tie_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
            qkv_bias=families.qkv_bias(c), out_bias=families.out_bias(c), mlp_bias=families.mlp_bias(c),
            layer_windows=windows if any(w is not None for w in windows) else None,
        )
    if mt == "gpt_neo":
        return ModelConfig(
            "gptneo", c.hidden_size, c.intermediate_size or 4 * c.hidden_size, c.num_layers, c.num_heads,
            c.vocab_size, c.max_position_embeddings, window_size=c.window_size, norm_eps=c.layer_norm_epsilon,
            tie_embeddings=bool(getattr(c, "tie_word_embeddings", True)),
        )
    raise ValueError(f"unsupported architecture {mt or type(c).__name__!r}; supported: {', '.join(families.SUPPORTED)}")


def _layer_windows(cfg: ModelConfig) -> list[int | None]:
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
        block = block_matmul_params(c) + h + f + h + 4 * h  # q,k,v,o, c_fc, c_proj; out_proj, c_fc, c_proj biases; 2 LayerNorms
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


def model_flops_per_token(model_or_config, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward) for MFU, PaLM / nanoGPT convention.

        flops_per_token = 6 * N + 12 * sum_over_layers(n_heads * head_dim * T_l)

    * ``N`` = parameters that take part in a matmul per token: every decoder block, the final norm
      and the LM head (counted even when tied to the embedding, since the output projection is a
      real GEMM). Token and position embeddings are excluded: they are look-ups, not matmuls.
      6 = 2 (multiply-add) x 3 (forward, grad wrt input, grad wrt weight).
    * The attention term counts QK^T and AV (2 matmuls x 2 FLOPs x 3 passes = 12) over ``T_l``
      keys: ``T_l = seq_len`` on global layers (as PaLM; causal masking is not discounted) and
      ``min(seq_len, window)`` on GPT-Neo's local layers and Mistral's / Qwen2's sliding-window layers. Query heads count, so GQA does
      not reduce it.
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    c = _config_of(model_or_config)
    n = count_parameters(c).matmul
    attn = 0
    for w in _layer_windows(c):
        t = min(seq_len, w) if w else seq_len
        attn += 12 * c.num_heads * c.head_dim * t
    return float(6 * n + attn)


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
