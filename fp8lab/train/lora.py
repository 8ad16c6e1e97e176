"""LoRA adapters on the converted model (peft), and their export: the adapter folder and the merged model.

The rule (which projections, how many parameters, what a run may ask) is fp8lab.plan.lora. Here the mechanism:
peft's ``LoraConfig`` from the run's options, the adapters injected in place (``peft.inject_adapter_in_model``: the
model keeps its class and module names, so the conversion's record, the LM head's fused loss, wrapping and
checkpoints work as for a full fine-tune) and the base frozen. peft wraps what it finds at each target: Transformer
Engine's ``te.Linear`` through its TE layer (peft >= 0.19) on a GPU, the emulator's ``EmuLinear`` (an ``nn.Linear``)
through its default LoRA layer, whose base GEMM stays the emulated FP8 one, on a CPU. The adapters' own GEMMs run
in the compute dtype, outside FP8: they are small, and their gradients are what trains.

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

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


def apply(model: torch.nn.Module, plan) -> Adapters:
    """Inject the plan's LoRA adapters into ``model`` (the converted model, in place) and freeze the rest."""
    from peft import inject_adapter_in_model
    from peft.tuners.lora import LoraLayer

    c, mcfg = plan.config, plan.model_config
    cfg = lora_config(c, mcfg.family)
    inject_adapter_in_model(cfg, model, adapter_name=ADAPTER)
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
    adapted = sum(isinstance(m, LoraLayer) for m in model.modules())
    return Adapters(cfg, lora_plan.parse_targets(c.lora_targets, mcfg.family), adapted, params, frozen)


def split_state_dict(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A trained model's state dict as (the base under its HF names, the adapters under peft's names)."""
    base, adapters = {}, {}
    for k, v in sd.items():
        if is_adapter(k):
            adapters[k] = v
        elif not k.endswith("_extra_state"):  # FP8 scaling state of the converted layers: not the HF model's
            base[k.replace(".base_layer.", ".")] = v
    return base, adapters


def peft_model_from(adapters: Adapters, plan, sd: dict[str, torch.Tensor]):
    """The plain transformers model of ``plan`` holding the trained base of ``sd``, with peft's LoRA on it holding
    the trained adapters (a ``peft.PeftModel``, on the CPU)."""
    from peft import get_peft_model

    base, trained = split_state_dict(sd)
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
    peft_model = peft_model_from(adapters, plan, sd)
    fexport.save_hf_model(model, inner, None, plan, model_dir, data_dir, env, run=run,
                          write=lambda stage: peft_model.save_pretrained(str(stage)))
    if plan.config.export_merged:
        merged = peft_model.merge_and_unload()
        fexport.save_hf_model(model, inner, None, plan, Path(model_dir) / MERGED, data_dir, env, run=run,
                              write=lambda stage: merged.save_pretrained(str(stage)))


def exported_file(c) -> str:
    """The file whose presence in ``--model-dir`` says the run's model was exported."""
    return ADAPTER_FILE if c.lora_rank else "config.json"
