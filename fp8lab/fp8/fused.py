"""The fused decoder (``fuse=True``) shared by the TE and emulated backends, and its HF weight map.

Each HF decoder block becomes four fused pieces, the layout of Transformer Engine's building blocks:

    qkv  = LayerNormLinear(norm -> one GEMM for Q, K and V)       [q; k; v] rows (and biases) concatenated
    attn = DotProductAttention(causal, GQA, window, softmax_scale)  no parameters
    proj = Linear(attention output -> hidden)
    mlp  = LayerNormMLP(norm -> fc1 -> activation -> fc2)         llama layout: fc1 = [gate; up] (SwiGLU)

The families (``fp8lab.model.families``): Llama, Mistral and Qwen2 share the llama layout and differ in data:
Q/K/V biases (Qwen2; Llama ``attention_bias``, which also biases the output projection), MLP biases
(Llama ``mlp_bias``), per-layer windows (Mistral's ``sliding_window``, Qwen2's sliding layers), and
the RoPE variant, whose frequencies transformers computes (``fp8lab.model.rope.HFRope``); yarn's/longrope's
attention scaling is folded into the softmax scale. GPT-Neo: LayerNorm, GELU, learned positions, local
layers, and no division of the scores by sqrt(head_dim) (``softmax_scale=1.0``).

A backend supplies the pieces (``Parts``); this module wires them, applies RoPE or learned positions
itself, and keeps the token embedding and LM head as plain high-precision modules.

The HF <-> fused mapping is data (``weight_map``): ``{}`` stands for the layer index, a rule with
several HF keys concatenates them along dim 0 in order (and splits them back by their HF shapes).
Both directions check key counts and shapes and load strictly.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Protocol

import torch
from torch import nn

from fp8lab.model import families
from fp8lab.model.rope import HFRope, rope_parameters, rope_problem

SUPPORTED_ARCHITECTURES = {k: f.hf_class for k, f in families.SUPPORTED.items()}


@dataclass(frozen=True)
class FusedSpec:
    """Everything the fused model needs to know about the HF architecture."""

    family: str  # "llama" (Llama, Mistral, Qwen2: RMSNorm, SwiGLU, RoPE) | "gptneo"
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    max_pos: int
    eps: float
    normalization: str  # TE spelling: "RMSNorm" | "LayerNorm"
    activation: str  # TE spelling: "swiglu" | "gelu" (tanh approximation = HF gelu_new)
    qkv_bias: bool  # Q/K/V biases (Qwen2; Llama attention_bias)
    proj_bias: bool  # attention output projection bias (GPT-Neo; Llama attention_bias; never Qwen2)
    mlp_bias: bool  # fc1/fc2 biases (GPT-Neo; Llama mlp_bias)
    softmax_scale: float  # 1/sqrt(head_dim) times RoPE's attention_scaling^2; 1.0 for GPT-Neo (unscaled scores)
    windows: tuple[int | None, ...]  # per layer: None = full causal, w = the last w tokens (self included)
    rope_theta: float | None  # RoPE base; None = learned positions (GPT-Neo)
    tied: bool  # LM head shares the token embedding
    rope_type: str = "default"  # transformers' RoPE variant; its frequencies come from fp8lab.model.rope.HFRope
    # the MLP as two modules, norm + fc1 and fc2 (SplitMLP), where LayerNormMLP fuses them: LoRA's adapters on the
    # MLP's projections add their output between the two (FusedCausalLM.split_mlps); the weight map follows
    split_mlp: bool = False


def architecture_of(model: nn.Module) -> str:
    """The model_type of a supported HF model, else a ValueError listing the supported classes."""
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt not in SUPPORTED_ARCHITECTURES or not hasattr(model, "lm_head"):
        raise ValueError(
            f"unsupported architecture {type(model).__name__} (model_type={mt!r}); supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES.values())} (e.g. from fp8lab.model.models.build_model)"
        )
    return mt


def fused_problem(c: Any) -> str | None:
    """Why the fused model cannot represent the HF config ``c`` exactly (None: it can).

    Checked from the config alone, so a trainer refuses before anything is built. Each reason names
    the feature and the alternative: ``fuse=False`` swaps the HF model's Linear layers one for one and
    keeps everything else of the HF model as it is."""
    alt = "; use fuse=False (--fuse False), which keeps the Hugging Face modules and swaps only their Linear layers"
    mt = getattr(c, "model_type", None)
    if mt in SUPPORTED_ARCHITECTURES and families.SUPPORTED[mt].layout == "llama":
        name = families.SUPPORTED[mt].label
        if c.hidden_act != "silu":
            return (f"{name} hidden_act={c.hidden_act!r} is not supported by the fused conversion (SwiGLU needs "
                    f"'silu'){alt}")
        problem = rope_problem(c)
        if problem:
            return f"{name} RoPE: {problem}{alt}"
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        try:
            half = hf_rope(c).half
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:  # transformers cannot build it either
            return (f"{name} RoPE: transformers' rotary embedding cannot be built from this config "
                    f"({type(exc).__name__}: {exc})")
        if 2 * half != hd:
            return (f"{name} RoPE rotates {2 * half} of the {hd} dimensions of each head (partial rotary): "
                    f"the fused conversion rotates whole heads{alt}")
        return None
    if mt == "gpt_neo":
        if c.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            return (f"GPT-Neo activation_function={c.activation_function!r} is not supported by the fused conversion "
                    f"(tanh GELU only){alt}")
        return None
    return None  # architecture_of reports unsupported architectures


def hf_rope(c: Any) -> HFRope | None:
    """transformers' RoPE (the family's own rotary class) for an HF config of the llama layout, None for GPT-Neo."""
    mt = getattr(c, "model_type", None)
    return HFRope(families.rotary_class(mt), c) if families.SUPPORTED[mt].layout == "llama" else None


def spec_from_hf(model: nn.Module) -> FusedSpec:
    c = model.config
    arch = architecture_of(model)
    problem = fused_problem(c)
    if problem:
        raise ValueError(problem)
    if families.SUPPORTED[arch].layout == "llama":
        rp = rope_parameters(c)
        hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        hfr = hf_rope(c)
        return FusedSpec(
            "llama", c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.num_attention_heads,
            c.num_key_value_heads, hd, c.vocab_size, c.max_position_embeddings, c.rms_norm_eps,
            "RMSNorm", "swiglu", families.qkv_bias(c), families.out_bias(c), families.mlp_bias(c),
            hfr.attention_scaling ** 2 / math.sqrt(hd), families.layer_windows(c),
            float(rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))), bool(c.tie_word_embeddings), hfr.rope_type,
        )
    windows = tuple(c.window_size if t == "local" else None for t in c.attention_layers)
    return FusedSpec(
        "gptneo", c.hidden_size, c.intermediate_size or 4 * c.hidden_size, c.num_layers, c.num_heads,
        c.num_heads, c.hidden_size // c.num_heads, c.vocab_size, c.max_position_embeddings,
        c.layer_norm_epsilon, "LayerNorm", "gelu", False, True, True, 1.0, windows, None,
        bool(getattr(c, "tie_word_embeddings", True)),
    )


# --------------------------------------------------------------------------------------------
# weight map: data, applied by one function per direction
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Rule:
    hf: tuple[str, ...]  # HF keys ({} = layer index); several = concatenated along dim 0 in this order
    fused: str  # key in the fused model


def weight_map(spec: FusedSpec) -> list[Rule]:
    """The HF -> fused key map for one architecture (its family and which biases it has)."""
    R = Rule
    if spec.family == "llama":
        a, m = "model.layers.{}.self_attn.", "model.layers.{}.mlp."
        rules = [
            R(("model.embed_tokens.weight",), "embed.weight"),
            R(("model.layers.{}.input_layernorm.weight",), "blocks.{}.qkv.layer_norm_weight"),
            R((a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), "blocks.{}.qkv.weight"),
            R((a + "o_proj.weight",), "blocks.{}.proj.weight"),
            R(("model.layers.{}.post_attention_layernorm.weight",), "blocks.{}.mlp.layer_norm_weight"),
            R((m + "gate_proj.weight", m + "up_proj.weight"), "blocks.{}.mlp.fc1_weight"),  # gate first: SwiGLU
            R((m + "down_proj.weight",), "blocks.{}.mlp.fc2_weight"),
            R(("model.norm.weight",), "norm.weight"),
            R(("lm_head.weight",), "lm_head.weight"),
        ]
        if spec.qkv_bias:
            rules.append(R((a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"), "blocks.{}.qkv.bias"))
        if spec.proj_bias:
            rules.append(R((a + "o_proj.bias",), "blocks.{}.proj.bias"))
        if spec.mlp_bias:
            rules += [R((m + "gate_proj.bias", m + "up_proj.bias"), "blocks.{}.mlp.fc1_bias"),
                      R((m + "down_proj.bias",), "blocks.{}.mlp.fc2_bias")]
        return rules
    h, a = "transformer.h.{}.", "transformer.h.{}.attn.attention."
    return [
        R(("transformer.wte.weight",), "embed.weight"),
        R(("transformer.wpe.weight",), "pos_embed.weight"),
        R((h + "ln_1.weight",), "blocks.{}.qkv.layer_norm_weight"),
        R((h + "ln_1.bias",), "blocks.{}.qkv.layer_norm_bias"),
        R((a + "q_proj.weight", a + "k_proj.weight", a + "v_proj.weight"), "blocks.{}.qkv.weight"),
        R((a + "out_proj.weight",), "blocks.{}.proj.weight"),
        R((a + "out_proj.bias",), "blocks.{}.proj.bias"),
        R((h + "ln_2.weight",), "blocks.{}.mlp.layer_norm_weight"),
        R((h + "ln_2.bias",), "blocks.{}.mlp.layer_norm_bias"),
        R((h + "mlp.c_fc.weight",), "blocks.{}.mlp.fc1_weight"),
        R((h + "mlp.c_fc.bias",), "blocks.{}.mlp.fc1_bias"),
        R((h + "mlp.c_proj.weight",), "blocks.{}.mlp.fc2_weight"),
        R((h + "mlp.c_proj.bias",), "blocks.{}.mlp.fc2_bias"),
        R(("transformer.ln_f.weight",), "norm.weight"),
        R(("transformer.ln_f.bias",), "norm.bias"),
        R(("lm_head.weight",), "lm_head.weight"),  # tied to wte in both models
    ]


# LayerNormMLP's parameters -> SplitMLP's (FusedSpec.split_mlp): the same tensors under the two modules' names
SPLIT_MLP_NAMES = {"layer_norm_weight": "fc1.layer_norm_weight", "layer_norm_bias": "fc1.layer_norm_bias",
                   "fc1_weight": "fc1.weight", "fc1_bias": "fc1.bias",
                   "fc2_weight": "fc2.weight", "fc2_bias": "fc2.bias"}


def _split_mlp_rule(rule: Rule) -> Rule:
    head, sep, name = rule.fused.partition(".mlp.")
    return Rule(rule.hf, f"{head}.mlp.{SPLIT_MLP_NAMES[name]}") if sep else rule


def hf_projection(spec: FusedSpec, name: str) -> str:
    """The HF module path (``{}``: the layer) of the projection ``name`` (families.PROJECTIONS), from the weight map."""
    for r in weight_map(spec):
        for k in r.hf:
            if k.endswith(f".{name}.weight"):
                return k[: -len(".weight")]
    raise ValueError(f"no projection {name!r} in the {spec.family} layout; allowed: "
                     + ", ".join(families.PROJECTIONS[spec.family]))


def expand_rules(spec: FusedSpec) -> list[Rule]:
    """Rules with ``{}`` replaced by every layer index."""
    out = []
    layers = spec.layers
    for r in weight_map(spec):
        if spec.split_mlp:
            r = _split_mlp_rule(r)
        if "{}" in r.fused:
            out += [Rule(tuple(k.format(i) for k in r.hf), r.fused.format(i)) for i in range(layers)]
        else:
            out.append(r)
    return out


def _is_state(key: str) -> bool:
    return key.endswith("_extra_state")  # TE's FP8 metadata: not a weight


def _hf_to_fused_items(hf_sd: dict[str, torch.Tensor], spec: FusedSpec) -> Iterator[tuple[str, torch.Tensor]]:
    """The fused state dict from an HF one, a key at a time (every HF key used exactly once, checked first): a caller
    that copies each joined weight away before asking for the next holds one of them at a time, not the model's."""
    rules = expand_rules(spec)
    needed = {k for r in rules for k in r.hf}
    missing, unused = sorted(needed - set(hf_sd)), sorted(set(hf_sd) - needed)
    if missing or unused:
        raise ValueError(f"HF state dict does not match the {spec.family} map: missing {missing[:5]}, unused "
                         f"{unused[:5]}")
    return ((r.fused, torch.cat([hf_sd[k] for k in r.hf], 0) if len(r.hf) > 1 else hf_sd[r.hf[0]]) for r in rules)


def fused_to_hf(fused_sd: dict[str, torch.Tensor], spec: FusedSpec,
                hf_shapes: dict[str, torch.Size]) -> dict[str, torch.Tensor]:
    """HF state dict from a fused one, split by the HF shapes; counts and shapes are checked."""
    rules = expand_rules(spec)
    sd = {k: v for k, v in fused_sd.items() if not _is_state(k)}
    needed = {r.fused for r in rules}
    missing, unused = sorted(needed - set(sd)), sorted(set(sd) - needed)
    if missing or unused:
        raise ValueError(f"fused state dict does not match the {spec.family} map: missing {missing[:5]}, unused "
                         f"{unused[:5]}")
    out: dict[str, torch.Tensor] = {}
    for r in rules:
        t = sd[r.fused]
        sizes = [hf_shapes[k][0] for k in r.hf]
        if sum(sizes) != t.shape[0]:
            raise ValueError(f"{r.fused}: shape {tuple(t.shape)} does not split into {r.hf} of rows {sizes}")
        for k, piece in zip(r.hf, torch.split(t, sizes, 0) if len(r.hf) > 1 else (t,)):
            if piece.shape != hf_shapes[k]:
                raise ValueError(f"{k}: fused piece has shape {tuple(piece.shape)}, HF expects {tuple(hf_shapes[k])}")
            out[k] = piece.detach().clone()
    if set(out) != set(hf_shapes):
        raise ValueError(f"HF keys not produced: {sorted(set(hf_shapes) - set(out))[:5]}")
    return out


# --------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------

class Parts(Protocol):
    """What a backend provides to build fused blocks (TE modules, or their emulated twins)."""

    # norm -> one GEMM; bias None: the Q/K/V bias of the spec; the module's ``return_layernorm_output`` (TE's name),
    # set True, makes it return (output, the norm's output)
    def norm_linear(self, spec: FusedSpec, out_features: int, bias: bool | None = None) -> nn.Module: ...
    def linear(self, spec: FusedSpec, in_features: int, out_features: int, bias: bool) -> nn.Module: ...
    def norm_mlp(self, spec: FusedSpec) -> nn.Module: ...
    def attention(self, spec: FusedSpec, window: int | None, layer_number: int) -> nn.Module: ...
    def norm(self, spec: FusedSpec) -> nn.Module: ...
    def high_precision(self) -> Any: ...  # context manager that turns FP8 off inside an FP8 region
    # optional: ``rope`` (a RoPE implementation like ``TorchRope``; default ``TorchRope()``),
    # ``weight_cache = True`` when the modules accept ``is_first_microbatch`` (TE's FP8 weight cache), and
    # ``swiglu(y)``: a split MLP's SwiGLU of fc1's whole output (default ``SwiGLU.apply``), e.g. a fused kernel


def rope_angles(seq_len: int, head_dim: int, theta: float | torch.Tensor, device) -> torch.Tensor:
    """RoPE angles [s, d] in fp32, rotate-half layout (HF Llama): each frequency twice, halves concatenated.

    ``theta``: the RoPE base (plain RoPE), or the [head_dim / 2] inverse frequencies themselves
    (any variant, from ``fp8lab.model.rope.HFRope``)."""
    if isinstance(theta, torch.Tensor):
        inv = theta.to(device=device, dtype=torch.float32)
    else:
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    f = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
    return torch.cat([f, f], dim=-1)


def rope_cos_sin(seq_len: int, head_dim: int, theta: float | torch.Tensor,
                 device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE tables in the non-interleaved (rotate-half) layout that HF Llama uses; fp32 math."""
    emb = rope_angles(seq_len, head_dim, theta, device)  # [s, d]
    return emb.cos().to(dtype)[None, :, None, :], emb.sin().to(dtype)[None, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [b, s, h, d] rotated: x*cos + rotate_half(x)*sin, in x's dtype (also under autocast)."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class TorchRope:
    """RoPE in plain PyTorch ops; a backend may supply a fused kernel with the same two methods."""

    def tables(self, seq_len: int, head_dim: int, theta: float | torch.Tensor, device, dtype) -> Any:
        return rope_cos_sin(seq_len, head_dim, theta, device, dtype)

    def apply(self, x: torch.Tensor, tables: Any) -> torch.Tensor:
        return apply_rope(x, *tables)


def _rope_of(parts: Parts) -> TorchRope:
    return getattr(parts, "rope", None) or TorchRope()


def _caches_weights(parts: Parts) -> bool:
    return bool(getattr(parts, "weight_cache", False))


class SwiGLU(torch.autograd.Function):
    """``silu(gate) * up`` of ``[gate, up]`` (the last dimension's halves, as fc1's weight joins them), the same
    values and gradients as autograd's but with the gradient written straight into one ``[d gate, d up]`` tensor:
    autograd would write the halves' gradients apart and then join them, two more passes over the widest tensor
    of the block, each way, every micro-batch."""

    @staticmethod
    def forward(ctx, y: torch.Tensor) -> torch.Tensor:
        gate, up = y.chunk(2, -1)
        s = nn.functional.silu(gate)
        ctx.save_for_backward(gate, up, s)
        return s * up

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> torch.Tensor:
        gate, up, s = ctx.saved_tensors
        dy = torch.empty(gate.shape[:-1] + (2 * gate.shape[-1],), dtype=gate.dtype, device=gate.device)
        dgate, dup = dy.chunk(2, -1)
        torch.mul(dh, s, out=dup)
        torch.ops.aten.silu_backward.grad_input(dh * up, gate, grad_input=dgate)
        return dy


class SplitMLP(nn.Module):
    """LayerNormMLP's computation as two modules, norm + fc1 and fc2, so that the activation's input and output
    exist between them (where LoRA's adapters on the MLP's projections add); same parameters, other names."""

    def __init__(self, spec: FusedSpec, parts: Parts):
        super().__init__()
        self.activation = spec.activation
        self._swiglu = getattr(parts, "swiglu", None) or SwiGLU.apply  # (a function, not state)
        self.fc1 = parts.norm_linear(spec, (2 if spec.activation == "swiglu" else 1) * spec.ffn, bias=spec.mlp_bias)
        self.fc2 = parts.linear(spec, spec.ffn, spec.hidden, spec.mlp_bias)

    def sizes(self) -> list[int] | None:
        """fc1's row blocks: [gate, up] under SwiGLU (gate first, as the weight map concatenates them)."""
        return [self.fc2.in_features] * 2 if self.activation == "swiglu" else None

    def act(self, y: torch.Tensor) -> torch.Tensor:
        """The activation of fc1's whole output ``y`` (gate and up side by side under SwiGLU)."""
        if self.activation == "swiglu":
            return self._swiglu(y)
        return nn.functional.gelu(y, approximate="tanh")

    def forward(self, x: torch.Tensor, **kw: Any) -> torch.Tensor:
        y = self.fc1(x, **kw)
        return self.fc2(self.act(y[0] if isinstance(y, tuple) else y), **kw)


class FusedBlock(nn.Module):
    def __init__(self, spec: FusedSpec, parts: Parts, layer: int):
        super().__init__()
        self.spec, self.window = spec, spec.windows[layer]
        q, kv = spec.heads * spec.head_dim, spec.kv_heads * spec.head_dim
        self.qkv = parts.norm_linear(spec, q + 2 * kv)
        self.attn = parts.attention(spec, self.window, layer + 1)
        self.proj = parts.linear(spec, q, spec.hidden, spec.proj_bias)
        self.mlp = parts.norm_mlp(spec)
        self.fp8 = True  # False: this block runs in high precision even inside an FP8 autocast
        self._hp = parts.high_precision
        self._rope = _rope_of(parts)
        self._weight_cache = _caches_weights(parts)
        # LoRA (fp8lab.train.lora.BlockAdapters): adapters by HF projection name (families.PROJECTIONS) whose
        # output adds to that projection's, read from the GEMM's own input (a norm's output where it has its norm)
        self.lora: nn.ModuleDict | None = None

    def _project(self, where: str, module: nn.Module, x: torch.Tensor, kw: dict,
                 sizes: list[int] | None) -> torch.Tensor:
        """GEMM ``where``'s output, whole, with its adapters' outputs added onto their row blocks (``sizes``)."""
        out = module(x, **kw)
        if isinstance(out, tuple):  # (output, the norm's output): the adapters read what the GEMM read
            out, x = out
        return out if self.lora is None else self.lora.onto(where, out, x, sizes)

    def forward(self, x: torch.Tensor, rope: Any, is_first_microbatch: bool | None = None) -> torch.Tensor:
        # is_first_microbatch (TE): True quantises the weights to FP8 and keeps them, False reuses
        # them; only valid while the weights do not change (micro-batches of one optimizer step)
        kw = ({"is_first_microbatch": is_first_microbatch} if self._weight_cache and is_first_microbatch is not None
              else {})
        with nullcontext() if self.fp8 else self._hp():
            s = self.spec
            b, t, _ = x.shape
            sizes = [s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim]
            q, k, v = self._project("qkv", self.qkv, x, kw, sizes).split(sizes, -1)
            q, k, v = (z.reshape(b, t, -1, s.head_dim) for z in (q, k, v))
            if rope is not None:
                q, k = self._rope.apply(q, rope), self._rope.apply(k, rope)
            x = x + self._project("proj", self.proj, self.attn(q.contiguous(), k.contiguous(), v.contiguous()), kw,
                                  None)
            if not isinstance(self.mlp, SplitMLP):
                return x + self.mlp(x, **kw)
            h = self.mlp.act(self._project("fc1", self.mlp.fc1, x, kw, self.mlp.sizes()))
            return x + self._project("fc2", self.mlp.fc2, h, kw, None)


class FusedCausalLM(nn.Module):
    """A causal LM assembled from fused blocks; embeddings, final norm and LM head stay high precision.

    ``forward(input_ids, labels=None)`` returns a ``CausalLMOutput`` with HF's loss convention
    (labels shifted inside, -100 ignored).
    """

    def __init__(self, spec: FusedSpec, parts: Parts, hf_config: Any, hf_class: type, backend: str,
                 device=None, dtype=None, rope_source: HFRope | None = None):
        super().__init__()
        self.spec, self.config, self.hf_class, self.backend = spec, hf_config, hf_class, backend
        kw = {"device": device, "dtype": dtype}
        self.embed = nn.Embedding(spec.vocab, spec.hidden, **kw)
        self.pos_embed = nn.Embedding(spec.max_pos, spec.hidden, **kw) if spec.rope_theta is None else None
        self.blocks = nn.ModuleList(FusedBlock(spec, parts, i) for i in range(spec.layers))
        self.norm = parts.norm(spec)
        self.lm_head = nn.Linear(spec.hidden, spec.vocab, bias=False, **kw)
        if spec.tied:
            self.lm_head.weight = self.embed.weight
        self._rope = _rope_of(parts)
        self._rope_tables: dict[tuple, Any] = {}  # (seq_len, device, dtype) -> tables; not state
        # transformers' RoPE frequencies per sequence length (None: plain RoPE from rope_theta); not state
        self.__dict__["_rope_source"] = rope_source
        # True: forward(..., is_first_microbatch=) caches FP8 weights across micro-batches (TE)
        self.supports_weight_cache = _caches_weights(parts)
        self._release_cache = getattr(parts, "release_weight_cache", None)
        self._wgrad_into_main_grad = getattr(parts, "wgrad_into_main_grad", None)
        self.__dict__["_parts"] = parts  # what split_mlps builds with; not state
        self.__dict__["_block_calls"] = None  # (callables, (batch, seq), pass is_first_microbatch): fp8lab.plan.graphs

    def split_mlps(self) -> None:
        """Rebuild each block's MLP as a SplitMLP holding the same weights (``spec.split_mlp``: the weight map and
        checkpoints follow the new names)."""
        if self.spec.split_mlp:
            return
        self.spec = replace(self.spec, split_mlp=True)
        for blk in self.blocks:
            old = blk.mlp
            new = SplitMLP(self.spec, self.__dict__["_parts"])
            with torch.no_grad():
                for name, p in old.named_parameters():
                    target = new.get_parameter(SPLIT_MLP_NAMES[name])
                    target.data = p.data.to(target.dtype)  # (the same storage: no second copy of the weights)
                    target.requires_grad_(p.requires_grad)
            blk.spec, blk.mlp = self.spec, new

    def use_block_calls(self, calls, shape: tuple[int, int], pass_first_microbatch: bool) -> None:
        """Replay ``calls`` (CUDA-graphed blocks, fp8lab.plan.graphs) instead of the blocks while training on
        batches of ``shape``; evaluation and other shapes run the eager blocks. Not state: kept out of
        the module tree, so state dicts and checkpoints are unchanged."""
        self.__dict__["_block_calls"] = (tuple(calls), tuple(shape), pass_first_microbatch)

    @property
    def graphed(self) -> bool:
        return self.__dict__.get("_block_calls") is not None

    def wgrad_into_main_grad(self) -> list[nn.Parameter]:
        """Weights whose gradients the backend accumulates into ``param.main_grad`` from now on ([]: none, autograd's
        ``.grad`` as usual)."""
        return self._wgrad_into_main_grad(self) if self._wgrad_into_main_grad is not None else []

    def release_weight_cache(self) -> None:
        """Free the cached FP8 weights (after the last micro-batch's backward, before the optimizer
        step): the next step quantises afresh anyway, and at 7B the cache is ~13 GB the step needs."""
        if self._release_cache is not None and not self.graphed:  # a graph keeps its cache in its own pool
            self._release_cache(self)

    def rope_tables(self, t: int, device, dtype) -> Any:
        key = (t, str(device), dtype)
        if key not in self._rope_tables:
            src = self.__dict__.get("_rope_source")
            theta = src.inv_freq(t) if src is not None else self.spec.rope_theta
            self._rope_tables[key] = self._rope.tables(t, self.spec.head_dim, theta, device, dtype)
        return self._rope_tables[key]

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None,
                is_first_microbatch: bool | None = None, **_: Any):
        from transformers.modeling_outputs import CausalLMOutput

        b, t = input_ids.shape
        if t > self.spec.max_pos:
            raise ValueError(f"sequence length {t} exceeds max_position_embeddings {self.spec.max_pos}")
        x = self.embed(input_ids)
        rope = None
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(t, device=input_ids.device))[None]
        else:
            rope = self.rope_tables(t, x.device, x.dtype)
        graphs = self.__dict__.get("_block_calls")
        if graphs is not None and self.training and torch.is_grad_enabled() and (b, t) == graphs[1]:
            kw = {"is_first_microbatch": bool(is_first_microbatch)} if graphs[2] else {}
            for call in graphs[0]:
                x = call(x, **kw)
        else:
            for blk in self.blocks:
                x = blk(x, rope, is_first_microbatch)
        logits = self.lm_head(self.norm(x))
        loss = causal_lm_loss(logits, labels) if labels is not None else None
        return CausalLMOutput(loss=loss, logits=logits)


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """HF's causal-LM loss: predict token t+1 from position t, in float32, ignoring -100."""
    return nn.functional.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
    )


def build_fused(hf_model: nn.Module, parts: Parts, backend: str, device=None,
                block_filter: Callable[[nn.Module, str], bool] | None = None) -> FusedCausalLM:
    """A fused model holding exactly ``hf_model``'s weights (loaded strictly), on ``device``."""
    spec = spec_from_hf(hf_model)
    p = next(hf_model.parameters())
    dev = torch.device(device) if device is not None else p.device
    fused = FusedCausalLM(spec, parts, hf_model.config, type(hf_model), backend, device=dev, dtype=p.dtype,
                          rope_source=hf_rope(hf_model.config))
    fused.to(dtype=p.dtype)  # TE parts take params_dtype; make the norms and everything else agree
    # every key but TE's _extra_state (FP8 metadata); the tensors share the parameters' storage
    target = {k: v for k, v in fused.state_dict().items() if not _is_state(k)}
    loaded = set()
    with torch.no_grad():  # copied key by key: the build holds one joined weight beside the two models, not all
        for k, v in _hf_to_fused_items(hf_model.state_dict(), spec):
            if k not in target or target[k].shape != v.shape:
                raise ValueError(f"{k}: HF gives shape {tuple(v.shape)}, fused model expects "
                                 f"{tuple(target[k].shape) if k in target else 'no such key'}")
            target[k].copy_(v)
            loaded.add(k)
            del v  # a joined weight is freed before the next is made
    if set(target) != loaded:
        raise ValueError(f"fused keys without an HF source: {sorted(set(target) - loaded)[:5]}")
    if block_filter is not None:
        layers = decoder_layers(hf_model)
        for i, blk in enumerate(fused.blocks):
            blk.fp8 = bool(block_filter(layers[i][1], layers[i][0]))
    return fused


def decoder_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(fqn, module) of each decoder block, in order, for HF and fused models."""
    if isinstance(model, FusedCausalLM):
        return [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)]
    if families.SUPPORTED[architecture_of(model)].layout == "llama":
        return [(f"model.layers.{i}", b) for i, b in enumerate(model.model.layers)]
    return [(f"transformer.h.{i}", b) for i, b in enumerate(model.transformer.h)]
