"""docs/results.md's run tables: fp8lab beside its peers (the section and the README's line; the table itself:
:mod:`fp8lab.analysis.peers`), every BF16/FP8 pair, per-GPU scaling and every run."""
from __future__ import annotations

import pandas as pd

from fp8lab import analysis
from fp8lab.views.html_table import fmt


def tps(v: float) -> str:
    return "-" if pd.isna(v) else f"{v:,.0f}"


def pct(v: float) -> str:
    return "-" if pd.isna(v) else f"{100 * v:.1f}%"


def peers_sentence(summary: pd.DataFrame, results_md: str) -> str | None:
    """One line on fp8lab beside its peers (docs/results.md's section), or None where no peer ran."""
    lead = analysis.lead_over_peers(analysis.peers_table(summary, analysis.layout_label))
    if not len(lead):
        return None
    parts = [f"{r['model']} on {r['gpu_name']}: fp8lab's FP8 {tps(r['fp8lab_fp8_tps'])} tokens/s/GPU, "
             f"{r['lead']:.2f}x the fastest peer ({r['fastest_peer']}, {tps(r['fastest_peer_tps'])})"
             for _, r in lead.iterrows()]
    return ("; ".join(parts) + ": plain `transformers` + `torch.compile`, BF16 and torchao float8, same GPU and call "
            f"([`{results_md}`]({results_md}#beside-the-peers))")


def peers_markdown(summary: pd.DataFrame) -> str:
    """docs/results.md's peers section: fp8lab's plain commands beside what a user would run instead, one GPU, one
    call."""
    table = analysis.peers_table(summary, analysis.layout_label)
    if not len(table):
        return ""
    lines = ["## Beside the peers", "",
             "What a user would run instead, measured on the same GPU in the same call as fp8lab's plain commands "
             "(`benchmarks/peers.py`): plain `transformers` with each decoder block `torch.compile`d, fp32 parameters "
             "under bf16 autocast, fused AdamW, in BF16 and with torchao float8 (its tensorwise, rowwise and "
             "rowwise_with_gw_hp recipes), at the same tokens per optimizer step. Relative: tokens/s/GPU over "
             "fp8lab's FP8.", ""]
    for (study, model, gpu), g in table.groupby(["study", "model", "gpu_name"], sort=True):
        lead = analysis.lead_over_peers(g)
        lines += [f"**{model}** on {gpu} (`{study}`)" + (
            f": fp8lab's FP8 is {lead['lead'].iloc[0]:.2f}x the fastest peer ({lead['fastest_peer'].iloc[0]})."
            if len(lead) else "."), "",
            "| who | variant | layout | tokens/s/GPU | MFU | peak GiB | relative |", "|---|---|---|---|---|---|---|"]
        for _, r in g.iterrows():
            mem = "-" if pd.isna(r["max_mem_gib"]) else f"{r['max_mem_gib']:.1f}"
            lines.append(f"| {r['who']} | {r['variant']} | {r['layout']} | {tps(r['tokens_per_sec_per_gpu'])} | "
                         f"{pct(r['mfu'])} | {mem} | {r['relative_to_fp8lab_fp8']:.2f}x |")
        lines.append("")
    return "\n".join(lines) + "\n"


def runs_markdown(summary: pd.DataFrame) -> str:
    cols = ["run", "study", "model", "variant", "layout", "GPUs", "tokens/s/GPU", "MFU", "val loss", "file"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    s = summary.assign(_size=summary["model"].map(analysis.model_size_b))
    for _, r in s.sort_values(["_size", "model", "study", "precision", "tokens_per_sec_per_gpu"],
                              ascending=[True, True, True, True, False]).iterrows():
        ws = "-" if pd.isna(r["world_size"]) else str(int(r["world_size"]))
        val = "-" if pd.isna(r["val_loss"]) else f"{r['val_loss']:.3f}"
        lines.append(f"| {r['run_id']} | {r['study']} | {r['model']} | {r['variant']} | {analysis.layout_label(r)} | "
                     f"{ws} | {tps(r['tokens_per_sec_per_gpu'])} | {pct(r['mfu'])} | {val} | `{r['source']}` |")
    return "\n".join(lines) + "\n"


MARKDOWN_COLUMNS = {  # comparison column -> header of the Markdown table (the README's results table)
    "model": "model", "gpu_name": "GPU", "world_size": "GPUs", "layout": "micro-batch, accumulation",
    "baseline_variant": "BF16 baseline",
    "fp8_variant": "FP8", "tps_baseline": "BF16 tokens/s/GPU", "tps_fp8": "FP8 tokens/s/GPU",
    "speedup": "speedup", "mfu_baseline": "BF16 MFU", "mfu_fp8": "FP8 MFU", "val_loss_gap_pct": "val loss gap %",
}


def comparison_markdown(comparison: pd.DataFrame) -> str:
    """Each FP8 run against its BF16 baseline, one Markdown table row each."""
    lines = ["| " + " | ".join(MARKDOWN_COLUMNS.values()) + " |", "|" + "---|" * len(MARKDOWN_COLUMNS)]
    for _, r in comparison.iterrows():
        cells = []
        for col in MARKDOWN_COLUMNS:
            v = r[col]
            if col == "speedup":
                cells.append(f"**{v:.2f}x**")
            elif col.startswith("mfu"):
                cells.append("-" if pd.isna(v) else f"{100 * v:.1f}%")
            elif col == "val_loss_gap_pct":
                cells.append("-" if pd.isna(v) else f"{v:+.2f}")
            else:
                cells.append(fmt(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    if not len(comparison):
        lines.append("| " + " | ".join(["-"] * len(MARKDOWN_COLUMNS)) + " |")
    return "\n".join(lines)


def scaling_markdown(scaling: pd.DataFrame) -> str:
    """Multi-GPU runs against their smallest-scale reference (empty when nothing ran at two scales)."""
    if not len(scaling):
        return ""
    by = analysis.scaling_axis(scaling)
    multi = scaling[scaling["run_id"] != scaling["reference_run_id"]]
    unit = "instances" if by == "instances" else "GPUs"
    lines = ["", f"Per-GPU scaling: each run against the same set-up on the fewest {unit}, measured closest in time "
             "(same session where there is one), and against the fastest such run.", "",
             f"| model | set-up | {unit} | tokens/s/GPU | reference tokens/s/GPU | hours apart | efficiency "
             "| vs fastest |",
             "|---|---|---|---|---|---|---|---|"]
    for _, r in multi.iterrows():
        hours = "-" if pd.isna(r["hours_apart"]) else f"{r['hours_apart']:.1f}"
        lines.append(f"| {r['model']} | {r['variant']} | {int(r[by])} | {fmt(float(r['tokens_per_sec_per_gpu']))} | "
                     f"{fmt(float(r['reference_tokens_per_sec_per_gpu']))} | {hours} | "
                     f"**{100 * r['efficiency']:.1f}%** | {100 * r['efficiency_vs_fastest']:.1f}% |")
    return "\n".join(lines) + "\n"
