"""What a model is, as data: ``ModelConfig`` (the architecture), the published named shapes, their
validation, and the two translations to and from ``transformers`` configs (plus building an HF class
from a config with seeded random weights).

``fp8lab.model.models`` turns a name (or a user's folder, through ``fp8lab.model.user``) into one of these
and counts what it costs; both build on this module, which imports neither.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from fp8lab.model import families

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
    # LM head shares the token embedding; None = family default (GPT-Neo tied, Llama not)
    tie_embeddings: bool | None = None
    # Llama layout only, read from a user's config.json (Mistral, Qwen2, Llama with biases); not overrides:
    qkv_bias: bool = False  # Q/K/V projections have biases (Qwen2; Llama attention_bias)
    out_bias: bool = False  # attention output projection has a bias (Llama attention_bias)
    mlp_bias: bool = False  # gate/up/down have biases (Llama mlp_bias)
    # per layer: sliding window (None = full causal); None = all full
    layer_windows: tuple[int | None, ...] | None = None

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
            raise ValueError(f"{name}: num_kv_heads must be a positive divisor of num_heads ({cfg.num_heads}), got "
                             f"{kv!r}")
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


def config_from_hf(c) -> ModelConfig:
    """Our ``ModelConfig`` for a transformers config of a supported family (``fp8lab.model.families``): the
    shape, biases and windows (FLOPs, memory plans and counts need nothing else; the RoPE variant is
    not represented, it changes no count)."""
    from fp8lab.model.rope import rope_parameters  # torch: ModelConfig and the named shapes stay torch-free

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
