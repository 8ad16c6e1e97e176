"""What a run is called and what it is, from one row of the tidy table (or a summary row).

Labels (``variant_label``: what ran; ``layout_label``: its batch layout), the model size read from
a model name, and predicates that treat a missing value as missing, not as False (``is_true``,
``is_false``, ``group_key``), with ``is_fp8`` and ``is_hardware_fp8``.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from fp8lab.records.data_format import PRETRAIN


def math_dtype(row: dict) -> object:
    """What a run's non-FP8 math ran in: its precision, except that a "bf16" run whose trainer computed
    in fp32 (``compute_dtype`` fp32, as its record says) is named "fp32": what it was."""
    precision = row.get("precision")
    if precision == "bf16" and row.get("compute_dtype") == "fp32":
        return "fp32"
    return precision


# the keys variant_label reads (math_dtype's included): rows alike in these have one label
VARIANT_KEYS = ("precision", "compute_dtype", "gpu_name", "backend", "recipe", "fuse", "recipe_spec",
                "bf16_edge_blocks",
                "activation_checkpointing", "compile", "cuda_graphs", "fp8_attention", "nvte_fp8_dpa_bwd",
                "param_dtype",
                "parallel", "world_size", "fsdp_keep_weights", "fp8_lm_head", "task")
FP8_HEAD = "fp8-head"  # variant_label's word for a run whose LM head's GEMMs ran in FP8


def variant_label(row: dict) -> str:
    """Short name of what ran: precision, backend, recipe, fused or not (e.g. 'fp8 te delayed fused';
    'fp32 hf' for a "bf16" run that computed in fp32 on a CPU: :func:`math_dtype`)."""
    parts = []
    fp8 = is_fp8(row.get("precision"))
    for key in ("precision", "backend", "recipe") if fp8 else ("precision", "backend"):
        v = math_dtype(row) if key == "precision" else row.get(key)
        if isinstance(v, str) and v and v not in parts and v != "none":
            parts.append(v)
    fuse = row.get("fuse")
    # torchao always swaps Linear layers
    if isinstance(fuse, (bool, np.bool_)) and fp8 and row.get("backend") != "torchao":
        parts.append("fused" if fuse else "unfused")
    spec = row.get("recipe_spec") if isinstance(row.get("recipe_spec"), str) else row.get("recipe")
    if fp8 and isinstance(spec, str) and ":" in spec:  # a recipe with its own settings (amax history, margin)
        parts.append("(" + spec.partition(":")[2] + ")")
    edge = row.get("bf16_edge_blocks")
    if fp8 and isinstance(edge, (int, float, np.integer, np.floating)) and not pd.isna(edge) and edge > 0:
        parts.append(f"bf16-edge-blocks={int(edge)}")
    if is_true(row.get("activation_checkpointing")):
        parts.append("act-ckpt")
    if is_true(row.get("compile")):
        parts.append("compile")
    if is_true(row.get("cuda_graphs")):
        parts.append("graphs")
    if fp8 and is_true(row.get("fp8_attention")):
        parts.append("fp8-attention")
        if str(row.get("nvte_fp8_dpa_bwd")) == "0":  # NVTE_FP8_DPA_BWD=0: its backward in BF16
            parts.append("bf16-attention-backward")
    if fp8 and is_flag(row.get("fp8_lm_head")):
        parts.append(FP8_HEAD)
    if row.get("param_dtype") == "bf16":
        parts.append("bf16-params")
    memory = row.get("memory")
    if isinstance(memory, str) and memory and memory != "plain":  # fewer bytes of state (fp8lab.plan.memory_modes)
        parts.append(memory)
    if is_fine_tune(row.get("task")):
        parts.append(row["task"])
    parallel = row.get("parallel")
    ws = row.get("world_size")
    one_process = isinstance(ws, (int, float, np.integer, np.floating)) and not pd.isna(ws) and ws <= 1
    if isinstance(parallel, str) and parallel and not one_process:  # several GPUs: DDP and FSDP2 are different set-ups
        parts.append(parallel)
        if is_true(row.get("fsdp_keep_weights")):
            parts.append("keep-weights")
    return " ".join(parts) or "unknown"


def variant_kind(variant: object) -> str:
    """The kind of run a variant label names, what a figure's legend tells apart: precision, backend
    and (FP8) recipe, e.g. 'fp8 te delayed fused bf16-params' -> 'fp8 te delayed', 'bf16 te bf16-params'
    -> 'bf16 te' (``variant_label`` puts these first)."""
    words = str(variant).split()
    return " ".join(words[:3] if words and is_fp8(words[0]) else words[:2])


def is_fp8(precision: object) -> bool:
    return isinstance(precision, str) and precision.lower().startswith("fp8")


def model_size_b(name: object) -> float:
    """Parameter count in billions parsed from a model name ('llama-1b' -> 1.0, 'x-125m' -> 0.125)."""
    if not isinstance(name, str):
        return math.nan
    m = re.search(r"(\d+(?:\.\d+)?)\s*([mb])(?![a-z])", name.lower())
    if not m:
        return math.nan
    return float(m.group(1)) * (1e-3 if m.group(2) == "m" else 1.0)


def is_true(v: object) -> bool:
    """An explicit True (Python or numpy bool; a missing value or a number is not True)."""
    return isinstance(v, (bool, np.bool_)) and bool(v)


def is_flag(v: object) -> bool:
    """:func:`is_true`, or 1.0: a column of True and missing values that pandas made float (e.g. ``fp8_lm_head``,
    which only the FP8-head runs' files set)."""
    return is_true(v) or (isinstance(v, (float, np.floating)) and v == 1.0)


def is_false(v: object) -> bool:
    """An explicit False (a missing value is not False)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and not bool(v)


LORA_SUFFIX = "-lora"


def task_label(task: str, lora_rank: int) -> str:
    """A run record's ``task`` from its options: --task (fp8lab.records.data_format.TASKS), with "-lora" where
    adapters alone trained (--lora-rank > 0)."""
    return f"{task}{LORA_SUFFIX}" if lora_rank else task


def is_fine_tune(task: object) -> bool:
    """Whether a run's ``task`` is a fine-tune (sft, sft-lora): its speed is another workload's than pretraining's
    (answers-only loss, frozen base), so it pairs and ranks only among its own task (missing: pretrain)."""
    return isinstance(task, str) and task not in ("", PRETRAIN)


def fine_tune_rows(table: pd.DataFrame) -> pd.Series:
    """Boolean mask of a runs or summary table's fine-tune rows (:func:`is_fine_tune`; no ``task`` column: none)."""
    if "task" not in table:
        return pd.Series(False, index=table.index)
    return table["task"].map(is_fine_tune).astype(bool)


def group_key(v: object) -> object:
    """A value fit for a groupby key: a missing value (None, NaN) becomes "?"."""
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else v


def is_hardware_fp8(run: pd.Series) -> bool:
    """Whether a run's FP8 ran on FP8 hardware (not the PyTorch emulation, not a CPU)."""
    gpu = run.get("gpu_name")
    return (run.get("backend") != "emulated" and isinstance(gpu, str)
            and not any(w in gpu.lower() for w in ("cpu", "mps")))


def layout_label(row) -> str:
    """Sequences x tokens per micro-batch and accumulation steps, e.g. '8x2048, accum 4'."""
    def num(k):
        v = row.get(k)
        return int(v) if isinstance(v, (int, float, np.integer, np.floating)) and not pd.isna(v) else None
    mb, seq, ga = num("micro_batch_size"), num("seq_len"), num("grad_accum")
    if mb is None or seq is None:
        return "-"
    return f"{mb}x{seq}" + (f", accum {ga}" if ga and ga > 1 else "")
