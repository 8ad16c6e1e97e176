"""LoRA adapters on the converted model, and their export: the adapter folder and the merged model.

The rule (which projections, how many parameters, what a run may ask) is fp8lab.plan.lora. Here the mechanism.

On fused blocks (fp8lab.fp8.fused) the adapters are fp8lab's own (``Adapter``): one fused GEMM computes Q, K and V
(and gate and up) at once, which peft cannot wrap, so each block keeps its adapters by projection name and adds
their output onto the GEMM's row block; an adapter reads what the GEMM read (the norm's output where the GEMM has
its norm), and the MLP is split in two where its projections are targets. The parameters carry peft's names and
initialisation, so the export hands them to peft under the HF model's module names.

On any other model: peft's ``LoraConfig`` from the run's options, the adapters injected in place
(``peft.inject_adapter_in_model``: the model keeps its class and module names, so the conversion's record, the LM
head's fused loss, wrapping and checkpoints work as for a full fine-tune) and the base frozen. peft wraps what it
finds at each target: Transformer Engine's ``te.Linear`` through its TE layer (peft >= 0.19) on a GPU, the
emulator's ``EmuLinear`` (an ``nn.Linear``) through its default LoRA layer, whose base GEMM stays the emulated FP8
one, on a CPU. The adapters' own GEMMs run in the compute dtype, outside FP8: they are small, and their gradients
are what trains.

Precision: the adapters are created in fp32. Where the plan keeps bf16 parameters with fp32 masters
(``RunPlan.master_weights``) the frozen base is stored in bf16 (it never steps, so it needs no master) and the adapters
get fp32 masters like any trainable parameter (fp8lab.train.master_weights keeps masters of trainable parameters
only); FSDP2 keeps its fp32 shards of both and casts them to bf16 when gathering.

Export rebuilds the plain transformers model holding the trained base, puts peft's LoRA on it (``get_peft_model``)
with the trained adapters, and writes that model's ``save_pretrained`` (the adapter folder, in ``--model-dir``) and,
with ``--export-merged``, the ``save_pretrained`` of its ``merge_and_unload()`` (a plain transformers folder, in
``<model-dir>/merged``): both load with peft / transformers alone, whatever layers trained.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fp8lab.fp8.convert import hf_state_dict_from
from fp8lab.fp8.fused import FusedCausalLM, hf_projection
from fp8lab.model import families
from fp8lab.model.models import MODEL_CONFIGS, build_model
from fp8lab.plan import lora as lora_plan
from fp8lab.records import ownership
from fp8lab.train import export as fexport

ADAPTER = "default"  # peft's adapter name inside the model (the saved folder's keys carry none)
MERGED = ownership.MERGED_MODEL  # the merged model's folder inside --model-dir
ADAPTER_FILE = "adapter_config.json"  # what an exported adapter folder holds (a finished run is recognised by it)


def is_adapter(name: str) -> bool:
    """A parameter or state-dict key of LoRA's adapters (``...q_proj.lora_A.default.weight``)."""
    return ".lora_" in name


def lora_config(c, family: str):
    """peft's LoraConfig of TrainConfig ``c`` for a model of decoder layout ``family``."""
    from peft import LoraConfig

    return LoraConfig(r=c.lora_rank, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout, bias="none",
                      target_modules=list(lora_plan.parse_targets(c.lora_targets, family)), task_type="CAUSAL_LM")


@dataclass
class Adapters:
    """LoRA on one model: peft's config, what trains and what stays frozen."""

    config: Any  # peft.LoraConfig
    targets: tuple[str, ...]
    adapted: int  # projections that got adapters
    params: int  # adapter parameters (what trains)
    frozen: int  # base parameters (frozen)

    def describe(self) -> str:
        share = 100.0 * self.params / max(1, self.params + self.frozen)
        return (f"LoRA rank {self.config.r} (alpha {self.config.lora_alpha:g}) on {self.adapted} projections "
                f"({', '.join(self.targets)}): {self.params:,} adapter parameters train ({share:.2f}%), "
                f"{self.frozen:,} base parameters frozen")

    def built(self) -> dict[str, Any]:
        """config.json's ``built`` entries of LoRA."""
        return {"lora_adapter_params": self.params, "lora_frozen_params": self.frozen,
                "lora_adapted_modules": self.adapted, "lora_targets": list(self.targets)}


class Adapter(nn.Module):
    """One projection's LoRA on a fused block, ``(alpha / r) * B A dropout(x)`` added to the projection's output, with
    peft's parameter names (``lora_A``, ``lora_B``) and initialisation (A Kaiming-uniform, B zero): the export hands
    them to peft as they are. Computed in the adapters' dtype, as peft's LoRA layer does, or under autocast in its
    dtype (as the GEMM would cast them)."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float, dropout: float, device=None):
        super().__init__()
        self.lora_A = nn.Linear(in_features, rank, bias=False, device=device, dtype=torch.float32)
        self.lora_B = nn.Linear(rank, out_features, bias=False, device=device, dtype=torch.float32)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.scaling = alpha / rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        # without dropout, under autocast, the GEMM casts its input to the autocast dtype anyway: an fp32 copy of x
        # first would add two passes over every adapted GEMM's input each way, and a copy kept for backward per
        # adapter, for the same bits (dropout scales in its input's dtype: there the fp32 copy keeps peft's bits)
        if not self.fast(x):
            x = x.to(self.lora_A.weight.dtype)
        z = self.lora_A(self.dropout(x))
        # scaled at rank width, not at the projection's: one elementwise pass over r columns instead of thousands
        return self.lora_B(z if self.scaling == 1 else z * self.scaling).to(dtype)

    def fast(self, x: torch.Tensor) -> bool:
        """Whether this adapter may join its GEMM's others in one product (:class:`BlockAdapters`): under autocast
        without dropout, where the GEMMs cast their inputs to the autocast dtype anyway (dropout draws a mask per
        adapter, and without autocast each adapter computes in its own dtype, as peft's layer does)."""
        return not isinstance(self.dropout, nn.Dropout) and torch.is_autocast_enabled(x.device.type)


class BlockAdapters(nn.ModuleDict):
    """One fused block's adapters by HF projection name (families.PROJECTIONS: which GEMM, which row block), added
    onto the GEMMs' outputs. The adapters of one GEMM read the same input, so under autocast without dropout they
    make one GEMM of their A's (the input read once) and one addmm of their B's, block-diagonal with their scalings,
    onto the whole output: the output is never split and joined again, and the input's gradient comes from one
    product. The same sums as each adapter on its own, in another order of the rank terms."""

    def __init__(self, adapters: dict[str, Adapter], family: str):
        super().__init__(adapters)
        self.where = {name: families.PROJECTIONS[family][name] for name in adapters}

    def onto(self, gemm: str, out: torch.Tensor, x: torch.Tensor, sizes: list[int] | None) -> torch.Tensor:
        """GEMM ``gemm``'s output ``out`` (row blocks ``sizes``; None: one) with its adapters' products added, from
        the GEMM's input ``x``."""
        mine = {part or 0: self[name] for name, (g, part) in self.where.items() if g == gemm}
        if not mine:
            return out
        widths = sizes or [out.shape[-1]]
        if not all(a.fast(x) for a in mine.values()):
            pieces = list(out.split(widths, -1))
            for i, a in mine.items():
                pieces[i] = pieces[i] + a(x)
            return torch.cat(pieces, -1) if len(pieces) > 1 else pieces[0]
        order = sorted(mine)
        a_all = torch.cat([mine[i].lora_A.weight for i in order])
        rank = a_all.shape[0]
        one = len({mine[i].scaling for i in order}) == 1  # one config, one scaling: the addmm's alpha
        alpha = mine[order[0]].scaling if one else 1.0
        rows, col = [], 0
        for i, width in enumerate(widths):
            if i not in mine:
                rows.append(a_all.new_zeros(width, rank))
                continue
            b = mine[i].lora_B.weight if one else mine[i].lora_B.weight * mine[i].scaling
            rows.append(nn.functional.pad(b, (col, rank - col - b.shape[1])))
            col += b.shape[1]
        return AddLowRank.apply(out, nn.functional.linear(x, a_all), torch.cat(rows), alpha)


class AddLowRank(torch.autograd.Function):
    """``out + alpha * z @ b.T`` written into ``out``'s own memory (one GEMM that reads and writes it once): an
    out-of-place addmm first copies the whole output, a pass over the block's widest tensors each micro-batch. The
    gradients are addmm's, in the same order of operations. ``out`` is a GEMM's fresh output that nothing else
    reads; were it saved for a backward, that backward would stop with autograd's in-place error."""

    @staticmethod
    def forward(ctx, out: torch.Tensor, z: torch.Tensor, b: torch.Tensor, alpha: float) -> torch.Tensor:
        res = out.detach()
        if not res.is_contiguous():
            res = res.contiguous()
        z2, bt = z.reshape(-1, z.shape[-1]).to(res.dtype), b.to(res.dtype).t()
        res.view(-1, res.shape[-1]).addmm_(z2, bt, alpha=alpha)
        ctx.save_for_backward(z2, bt)
        ctx.alpha, ctx.z_meta, ctx.b_dtype = alpha, (z.shape, z.dtype), b.dtype
        return res

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        z2, bt = ctx.saved_tensors
        g2 = g.reshape(-1, g.shape[-1])
        dz, dbt = g2.mm(bt.t()), z2.t().mm(g2)
        if ctx.alpha != 1:
            dz, dbt = dz * ctx.alpha, dbt * ctx.alpha
        shape, dtype = ctx.z_meta
        return g, dz.view(shape).to(dtype), dbt.t().to(ctx.b_dtype), None


def _inject_fused(model: FusedCausalLM, c, mcfg, targets: tuple[str, ...]) -> int:
    """Adapters on the fused blocks' GEMMs (peft cannot reach into a GEMM that computes several projections): each
    block's ``lora`` (fp8lab.fp8.fused.FusedBlock); the MLP split where its projections are targets. Returns how
    many projections got one."""
    where = {n: families.PROJECTIONS[mcfg.family][n][0] for n in targets}
    if {"fc1", "fc2"} & set(where.values()):
        model.split_mlps()
    shapes = lora_plan.shapes(mcfg)
    for blk in model.blocks:
        device = blk.qkv.weight.device
        blk.lora = BlockAdapters({n: Adapter(*shapes[n], c.lora_rank, c.lora_alpha, c.lora_dropout, device)
                                  for n in targets}, mcfg.family)
        for gemm, module in (("qkv", blk.qkv), ("fc1", getattr(blk.mlp, "fc1", None))):
            if gemm in where.values():
                module.return_layernorm_output = True  # the adapters read the norm's output, as the GEMM does
    return len(targets) * len(model.blocks)


def apply(model: torch.nn.Module, plan) -> Adapters:
    """Put the plan's LoRA adapters on ``model`` (the converted model, in place) and freeze the rest: fp8lab's own on
    fused blocks, peft's on any other model."""
    c, mcfg = plan.config, plan.model_config
    cfg = lora_config(c, mcfg.family)
    targets = lora_plan.parse_targets(c.lora_targets, mcfg.family)
    if isinstance(model, FusedCausalLM):
        adapted = _inject_fused(model, c, mcfg, targets)
    else:
        from peft import inject_adapter_in_model
        from peft.tuners.lora import LoraLayer

        inject_adapter_in_model(cfg, model, adapter_name=ADAPTER)
        adapted = sum(isinstance(m, LoraLayer) for m in model.modules())
    params = frozen = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            trains = is_adapter(name)
            p.requires_grad_(trains)
            if trains:
                p.data = p.data.float()
                params += p.numel()
            else:
                if plan.master_weights and p.is_floating_point():  # (FSDP2 keeps fp32 shards, one dtype a unit)
                    p.data = p.data.to(torch.bfloat16)
                frozen += p.numel()
    return Adapters(cfg, targets, adapted, params, frozen)


def _peft_name(spec, key: str) -> str:
    """A fused block's adapter key (``blocks.3.lora.q_proj.lora_A.weight``) under peft's name in the HF model
    (``model.layers.3.self_attn.q_proj.lora_A.default.weight``)."""
    _, layer, _, name, rest = key.split(".", 4)
    return f"{hf_projection(spec, name).format(layer)}.{rest.replace('.weight', f'.{ADAPTER}.weight')}"


def split_state_dict(sd: dict[str, torch.Tensor], inner: torch.nn.Module | None = None
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A trained model's state dict (of ``inner``, the model that trained) as (the base under its HF names, the
    adapters under peft's names)."""
    if isinstance(inner, FusedCausalLM):
        base = hf_state_dict_from(inner, {k: v for k, v in sd.items() if not is_adapter(k)})
        return base, {_peft_name(inner.spec, k): v for k, v in sd.items() if is_adapter(k)}
    base, adapters = {}, {}
    for k, v in sd.items():
        if is_adapter(k):
            adapters[k] = v
        elif not k.endswith("_extra_state"):  # FP8 scaling state of the converted layers: not the HF model's
            base[k.replace(".base_layer.", ".")] = v
    return base, adapters


def peft_model_from(adapters: Adapters, plan, sd: dict[str, torch.Tensor], inner: torch.nn.Module | None = None):
    """The plain transformers model of ``plan`` holding the trained base of ``sd`` (the state dict of ``inner``),
    with peft's LoRA on it holding the trained adapters (a ``peft.PeftModel``, on the CPU)."""
    from peft import get_peft_model

    base, trained = split_state_dict(sd, inner)
    name = plan.config.model
    hf = build_model(name, device="meta", config=plan.model_config if name in MODEL_CONFIGS else None)
    # its own copies: the gathered state dict may share the trained model's storage, which merging would change
    hf.load_state_dict({k: v.detach().clone() for k, v in base.items()}, strict=True, assign=True)
    if getattr(hf.config, "tie_word_embeddings", False):
        hf.tie_weights()  # (assign gave the head its own tensor)
    model = get_peft_model(hf, adapters.config, adapter_name=ADAPTER)
    result = model.base_model.model.load_state_dict(trained, strict=False)
    missing = [k for k in result.missing_keys if is_adapter(k)]
    if result.unexpected_keys or missing:
        raise ValueError(f"the trained adapters do not match peft's LoRA of {type(hf).__name__}: missing "
                         f"{missing[:3]}, unexpected {result.unexpected_keys[:3]}")
    return model


def export(adapters: Adapters, model, inner, plan, model_dir: Path, data_dir: Path, env, master=None,
           run: str | None = None) -> None:
    """The adapter folder into ``model_dir`` and, with ``--export-merged``, the merged model into its ``merged``
    folder (every rank calls: FSDP2 gathers the weights; rank 0 writes)."""
    sd = fexport._export_hf_state_dict(model, inner, None, master)  # the trained weights, masters where kept
    if not env.is_main:
        return
    peft_model = peft_model_from(adapters, plan, sd, inner)
    fexport.save_hf_model(model, inner, None, plan, model_dir, data_dir, env, run=run,
                          write=lambda stage: peft_model.save_pretrained(str(stage)))
    if plan.config.export_merged:
        merged = peft_model.merge_and_unload()
        fexport.save_hf_model(model, inner, None, plan, Path(model_dir) / MERGED, data_dir, env, run=run,
                              write=lambda stage: merged.save_pretrained(str(stage)))


def exported_file(c) -> str:
    """The file whose presence in ``--model-dir`` says the run's model was exported."""
    return ADAPTER_FILE if c.lora_rank else "config.json"
