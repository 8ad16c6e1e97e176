"""Why fp8lab's FP8 speed-up exceeds the source blog's: one model measured at the layouts that separate them.

The blog reports FP8 at 1.13x (1B) and 1.18x (7B) over its own BF16 on P5; fp8lab's headline is larger. The
committed runs of llama-7b on one H200 show where the gap comes from: the same model and recipe, one change
at a time, from the layout a plain script would use to the one the layout resolver picks. Each step is a
BF16 and an FP8 run of one study (measured in one session on one machine), named by its result files; the
numbers are read from those files, never typed here.
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from fp8lab.analysis.labels import model_size_b

BLOG_GAP_MODEL = "llama-7b"


@dataclass(frozen=True)
class Step:
    """One bar: what changed, and the BF16 and FP8 result files (``data/results/<study>/<stem>.jsonl``)."""

    label: str
    what: str
    study: str
    bf16: str
    fp8: str


STEPS = (
    Step("1 x 2048, fp32 params", "one sequence per micro-batch, fp32 parameters: a plain script's layout",
         "throughput-h200", "llama-7b-te-bf16", "llama-7b-te-fp8-delayed"),
    Step("1 x 2048, bf16 params", "bf16 parameters with fp32 master weights: less memory traffic in both",
         "graphs-h200", "llama-7b-te-bf16-p16-mb1-ga8-graphs-off-s8",
         "llama-7b-te-fp8-delayed-p16-mb1-ga8-graphs-off-s8"),
    Step("1 x 2048, CUDA graphs",
         "each block replayed as a CUDA graph: the launch-bound FP8 step no longer waits for Python",
         "graphs-h200", "llama-7b-te-bf16-p16-mb1-ga8-graphs-on-s8",
         "llama-7b-te-fp8-delayed-p16-mb1-ga8-graphs-on-s8"),
    Step("2 x 2048, accum 4", "two sequences per micro-batch: larger GEMMs, fewer launches per token",
         "throughput-h200", "llama-7b-te-bf16-p16-mb2-ga4", "llama-7b-te-fp8-delayed-p16-mb2-ga4"),
    Step("2 x 2048, accum 16",
         "16 micro-batches a step: the FP8 weight cache is cast once per step, the optimizer step diluted",
         "throughput-h200", "llama-7b-te-bf16-p16-mb2-ga16-fw", "llama-7b-te-fp8-delayed-p16-mb2-ga16-fw"),
)

def differences(table: pd.DataFrame) -> list[str]:
    """What differs between the blog's set-up and fp8lab's besides the layout, each a reason its speed-up may be
    smaller; the TE version is the one the table's FP8 runs recorded (the blog states none)."""
    te = sorted({str(v) for v in table.get("transformer_engine", pd.Series(dtype=object)).dropna()})
    return [
        "the blog's BF16 baseline is not described: its layers, layout and parameter precision are unknown",
        f"Transformer Engine {', '.join(te) or '(version not recorded)'} with fused blocks here; the blog (November "
        "2024) states no TE version",
        "one GPU here against FSDP over 8 GPUs per instance there: communication does not shrink with FP8",
    ]


def _pick(summary: pd.DataFrame, study: str, stem: str) -> pd.Series | None:
    hit = summary[summary["source"].astype(str).str.endswith(f"/{study}/{stem}.jsonl")]
    return hit.iloc[0] if len(hit) else None


def blog_gap_table(summary: pd.DataFrame, reference: pd.DataFrame | None = None,
                   steps: tuple[Step, ...] = STEPS) -> pd.DataFrame:
    """One row per step whose two result files are in ``summary`` (:func:`summarize_runs`): label, what changed,
    both runs, their tokens/s/GPU and FP8's speed-up, and the source's reported speed-up for the model's size."""
    blog = None
    if reference is not None and len(reference):
        size = model_size_b(BLOG_GAP_MODEL)
        near = reference.iloc[(reference["params_b"] - size).abs().argsort()[:1]]
        blog = float(near["speedup"].iloc[0])
    rows = []
    for s in steps:
        b, f = _pick(summary, s.study, s.bf16), _pick(summary, s.study, s.fp8)
        if b is None or f is None:
            continue
        rows.append({"model": BLOG_GAP_MODEL, "step": s.label, "what": s.what, "study": s.study,
                     "bf16_run": b["run_id"], "fp8_run": f["run_id"],
                     "gpu_name": f["gpu_name"], "tps_bf16": float(b["tokens_per_sec_per_gpu"]),
                     "tps_fp8": float(f["tokens_per_sec_per_gpu"]),
                     "speedup": float(f["tokens_per_sec_per_gpu"] / b["tokens_per_sec_per_gpu"]),
                     "source_speedup": blog, "transformer_engine": f.get("transformer_engine")})
    return pd.DataFrame(rows,
                        columns=["model", "step", "what", "study", "bf16_run", "fp8_run", "gpu_name", "tps_bf16",
                                 "tps_fp8",
                                       "speedup", "source_speedup", "transformer_engine"])


def sentence(table: pd.DataFrame) -> str:
    """The README's bullet: the range of the model's FP8 gain over the steps, against the blog's figure."""
    if not len(table):
        return "the layout study's result files are not in these runs."
    first, last = table.iloc[0], table.iloc[-1]
    blog = table["source_speedup"].dropna()
    vs = f" (the blog: {float(blog.iloc[0]):.2f}x, reported)" if len(blog) else ""
    return (f"{first['model']} on one {first['gpu_name']} gains {first['speedup']:.2f}x at {first['step']}, a plain "
            f"script's layout{vs}, and {last['speedup']:.2f}x at {last['step']}; between them: bf16 parameters, CUDA "
            "graphs, larger micro-batches and the FP8 weight cache cast once per step. The blog's BF16 baseline, TE "
            "version and FSDP over several instances differ too (notebook 05, `docs/results.md`).")


def markdown(table: pd.DataFrame) -> str:
    """The steps as a Markdown table, then the other differences as bullets (``docs/results.md``)."""
    lines = ["| step | what changed | BF16 tokens/s/GPU | FP8 tokens/s/GPU | FP8 / BF16 | runs |",
             "|---|---|---|---|---|---|"]
    for _, r in table.iterrows():
        lines.append(f"| {r['step']} | {r['what']} | {r['tps_bf16']:,.0f} | {r['tps_fp8']:,.0f} | "
                     f"**{r['speedup']:.2f}x** | `{r['bf16_run']}`, `{r['fp8_run']}` |")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {d}." for d in differences(table)) + "\n"
