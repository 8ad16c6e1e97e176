"""LoRA's rule and vocabulary, torch-free: which projections get adapters, how many parameters they add, and
what a LoRA run can be asked (checked with the options, before anything is built).

LoRA (``--lora-rank N``) trains two small matrices ``A`` (N x in) and ``B`` (out x N) beside each targeted
projection, ``W x + (alpha / N) B A x``; the base weights stay frozen. The adapters (``fp8lab.train.lora``: fp8lab's
own on fused blocks, peft's on unfused layers) go on the converted model, so the frozen base GEMMs run in FP8.

The names are HF's module names, the same in every family of one decoder layout (Llama, Mistral and Qwen2 share
``q_proj ... down_proj``; GPT-Neo has ``out_proj``, ``c_fc`` and ``c_proj``), so a name is checked against the
model's layout from its config alone. ``--lora-targets all`` (the default) is every projection of attention and MLP.
"""
from __future__ import annotations

from typing import Any

from fp8lab.core.validate import Check, is_count, is_num
from fp8lab.model import families

# the projections of each decoder layout (fp8lab.model.config.ModelConfig.family), attention then MLP
PROJECTIONS: dict[str, tuple[str, ...]] = {layout: tuple(names) for layout, names in families.PROJECTIONS.items()}
ALL = "all"  # --lora-targets: every projection of the layout (a name of the set, not a decision: the same everywhere)
RANK_ALLOWED = "an integer >= 0 (0: LoRA off, every weight trains)"
ALPHA_ALLOWED = "a number > 0 (the adapters' update is scaled by alpha / rank)"
DROPOUT_ALLOWED = "a number in [0, 1)"
# each option's own check (its field's: the trainer's and JobSpec's); the targets need the model's layout (problem)
RANK = Check(lambda v: is_count(v, 0), RANK_ALLOWED)
ALPHA = Check(lambda v: is_num(v) and v > 0, ALPHA_ALLOWED)
DROPOUT = Check(lambda v: is_num(v) and 0 <= v < 1, DROPOUT_ALLOWED)


def targets_allowed(family: str) -> str:
    return f"{ALL} (every one) or comma-separated names of " + ", ".join(PROJECTIONS[family])


def parse_targets(value: Any, family: str) -> tuple[str, ...] | None:
    """``--lora-targets`` as module names (``all``: every projection of the layout); None: not a valid value."""
    if value == ALL:
        return PROJECTIONS[family]
    if not isinstance(value, str):
        return None
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names or len(set(names)) != len(names) or any(n not in PROJECTIONS[family] for n in names):
        return None
    return names


def fuses(c) -> bool:
    """``--fuse`` as a run of TrainConfig ``c`` builds it: ``auto`` fuses each block, under LoRA too, where fp8lab's
    adapters on the fused GEMMs were faster than peft's on the model's own projections on every model measured
    (finetune-h100: Llama-3.2-1B in one call, Llama-3.1-8B and Qwen2.5-1.5B across calls)."""
    return c.fuse if isinstance(c.fuse, bool) else True


# why a LoRA option other than the rank is refused at a value not its default while --lora-rank is 0 (LoRA off: the
# run would ignore it, a full fine-tune that the user did not ask for); options not named here: the general reason
WITHOUT_RANK = {"export_merged": "a full fine-tune's model folder is already whole"}
OFF = "LoRA is off without it: the option would be ignored"


def problem(c, mcfg, defaults: dict[str, Any]) -> tuple[str, str] | None:
    """(option, allowed) for the first LoRA option a run of TrainConfig ``c`` on ``mcfg`` (its ModelConfig) cannot
    take, else None (checked with the options, after each one's own check: RANK, ALPHA, DROPOUT; before the layout
    and memory plan, which a huge rank would otherwise fail on, blaming the batch). ``defaults``: the LoRA options
    but the rank, at their declared defaults (TrainConfig's fields): without a rank, a changed one is refused."""
    targets = parse_targets(c.lora_targets, mcfg.family)
    if targets is None:
        return "lora_targets", targets_allowed(mcfg.family)
    if not c.lora_rank:
        for name, default in defaults.items():
            if getattr(c, name) != default:
                return name, (f"{default!r} without --lora-rank, or --lora-rank N to train adapters "
                              f"({WITHOUT_RANK.get(name, OFF)})")
        return None
    # B A has rank at most min(in, out) of its projection: a larger rank adds parameters and no capacity
    per_block = shapes(mcfg)
    name = min(targets, key=lambda n: min(per_block[n]))
    most = min(per_block[name])
    if c.lora_rank > most:
        return "lora_rank", (f"{RANK_ALLOWED}, at most {most} for --model {c.model}: the smallest in or out "
                             f"features of the adapted projections ({name}: {per_block[name][0]} -> "
                             f"{per_block[name][1]})")
    if c.export_merged and not c.save_model:  # else the run ends with neither the model folder nor the merged one
        return "export_merged", ("False with --save-model False (the merged model is written into the model folder, "
                                 "beside the adapters), or --save-model True")
    return None


def shapes(mcfg) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of one decoder block of ``mcfg`` (a ModelConfig)."""
    h, f = mcfg.hidden_size, mcfg.intermediate_size
    if mcfg.family == "llama":
        q, kv = mcfg.num_heads * mcfg.head_dim, mcfg.kv_heads * mcfg.head_dim
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, f),
                "up_proj": (h, f), "down_proj": (f, h)}
    return {"q_proj": (h, h), "k_proj": (h, h), "v_proj": (h, h), "out_proj": (h, h), "c_fc": (h, f), "c_proj": (f, h)}


def adapter_params(mcfg, rank: int, targets: tuple[str, ...]) -> int:
    """Parameters LoRA adds: ``rank * (in + out)`` per targeted projection and block."""
    per_block = shapes(mcfg)
    return mcfg.num_layers * sum(rank * sum(per_block[n]) for n in targets)


def adapted(c, mcfg) -> tuple[tuple[str, ...], bool] | None:
    """(the projections a run of TrainConfig ``c`` adapts, whether with dropout), None without LoRA."""
    if not getattr(c, "lora_rank", 0):
        return None
    return parse_targets(c.lora_targets, mcfg.family), c.lora_dropout > 0


def trainable_params(c, mcfg) -> int | None:
    """What trains in a run of TrainConfig ``c``: the adapters' parameters under LoRA, None (everything) without."""
    if not getattr(c, "lora_rank", 0):  # (a config of another caller may carry no LoRA options)
        return None
    return adapter_params(mcfg, c.lora_rank, parse_targets(c.lora_targets, mcfg.family))
