"""The memory lesson: FP8 does not halve training memory. Per model, the peak memory the best BF16 and
the best FP8 run reported (the committed result files), and the FP8 weight cache that fp8lab.plan.layout's memory model
charges to FP8: TE keeps an FP8 copy of every decoder-block weight and its transpose (2 bytes per weight) across
the micro-batches of a step, on top of the bf16 weights, fp32 master weights and AdamW moments (16 bytes per
parameter in either precision). FP8's activations are smaller, so a small model saves a little; at 7B the cache
outweighs that, and FP8 uses more."""
from __future__ import annotations

import pandas as pd

from fp8lab.model.models import block_matmul_params, count_parameters, get_config
from fp8lab.plan import memory_modes

GIB = 2.0**30


def weight_cache_gib(model: str) -> float:
    """TE's FP8 weight cache of ``model``: 2 bytes per decoder-block weight (nan for a model fp8lab cannot size)."""
    try:
        mcfg = get_config(model)
    except Exception:  # a model folder that is gone, or a label that is no model name
        return float("nan")
    return 2 * mcfg.num_layers * block_matmul_params(mcfg) / GIB


def peak_memory(answer, summary: pd.DataFrame) -> pd.DataFrame:
    """Per row (model and GPU) of ``answer``: the peak memory (GiB) its best BF16 and best FP8 run reported, FP8's
    difference in GiB and percent, and the FP8 weight cache the memory model charges (:func:`weight_cache_gib`)."""
    mem = summary.drop_duplicates("run_id").set_index("run_id")["max_mem_gib"]
    rows = []
    for _, a in answer.rows.iterrows():
        bf16, fp8 = mem.get(a["bf16_run"]), mem.get(a["fp8_run"])
        if pd.isna(bf16) or pd.isna(fp8):
            continue
        rows.append({"model": a["model"], "gpu_name": a["gpu_name"], "bf16_gib": bf16, "fp8_gib": fp8,
                     "fp8_minus_bf16_gib": fp8 - bf16,
                     "fp8_vs_bf16_pct": 100 * (fp8 / bf16 - 1), "fp8_weight_cache_gib": weight_cache_gib(a["model"]),
                     "bf16_layout": a["bf16_layout"], "fp8_layout": a["fp8_layout"]})
    return pd.DataFrame(rows,
                        columns=["model", "gpu_name", "bf16_gib", "fp8_gib", "fp8_minus_bf16_gib", "fp8_vs_bf16_pct",
                                       "fp8_weight_cache_gib", "bf16_layout", "fp8_layout"])


def states_by_mode(model: str) -> pd.DataFrame:
    """Per memory mode (fp8lab.plan.memory_modes), its index: bytes of state per parameter on the GPU and in host
    memory, and what ``model``'s states take there, in GiB, before any activation or FP8 weight."""
    n = count_parameters(get_config(model)).total
    return pd.DataFrame([{"mode": m.name, "gpu_bytes": m.state_bytes, "host_bytes": m.host_bytes,
                          "gpu_gib": m.state_bytes * n / GIB, "host_gib": m.host_bytes * n / GIB,
                          "moments": f"{m.exp_avg} / {m.exp_avg_sq}"} for m in memory_modes.MODES]).set_index("mode")


def measured_by_mode(summary: pd.DataFrame) -> pd.DataFrame:
    """The runs measured in a memory mode other than plain: model, GPU, mode, precision, layout, tokens/s/GPU and
    peak memory (GiB), one row per run."""
    if "memory" not in summary:
        return pd.DataFrame(columns=["model", "gpu_name", "memory", "precision", "variant", "tokens_per_sec_per_gpu",
                                     "max_mem_gib"])
    s = summary.drop_duplicates("run_id")
    s = s[s["memory"].map(memory_modes.of_record) != memory_modes.PLAIN]
    cols = ["model", "gpu_name", "memory", "precision", "fp8_weights", "variant", "micro_batch_size", "grad_accum",
            "tokens_per_sec_per_gpu", "max_mem_gib"]
    s = s[[c for c in cols if c in s]].sort_values(["model", "variant"]).reset_index(drop=True)
    if "fp8_weights" in s:  # (runs from before --fp8-weights cast their weights; a BF16 run has none)
        s["fp8_weights"] = s["fp8_weights"].where(s["precision"] == "fp8").fillna("cast").where(
            s["precision"] == "fp8", "-")
    return s
