"""Where a training step's time goes: torch.profiler kernels grouped into a few categories.

Why: "FP8 gains only 5%" has several possible causes (GEMMs that did not get faster, FP8
bookkeeping around them, the optimizer, or a GPU that waits for Python to launch kernels). The
categories below answer the first three; comparing the GPU's kernel time per step with the step's
wall time answers the last (``gpu_busy`` well under 1 means the GPU sat idle between kernels).

The trainer records steps with ``--profile-steps`` and writes ``profile.json`` through
:func:`summarize`; ``benchmarks/profile_step.py`` uses the same categories.
"""
from __future__ import annotations

import json
import re
import statistics
from pathlib import Path
from typing import Any, Iterable

from fp8lab.records import ownership

CATEGORIES = [  # (category, regex on the lower-cased kernel or op name), first match wins
    ("fp8 gemm", r"_scaled_mm|f8f6f4|nvjet_sm\d+_q[qr]"),  # cuBLAS names its FP8 GEMMs nvjet_*_qqtst / _qrtst
    ("attention", r"flash|fmha|attn|attention|cudnn.*sdpa|softmax_rescale|dot_product"),
    ("communication (nccl)", r"nccl"),  # all-gathers / reduce-scatters: overlap with compute, so not additive
    # before "fp8": TE's cast kernels name fp8 types
    ("fp8 cast/transpose/amax", r"cast|transpose|amax|quantize|scale"),
    ("gemm", r"gemm|xmma|cutlass|sm90_|nvjet|ampere_|cublas|aten::(mm|addmm|bmm|matmul|linear)$"),
    ("optimizer", r"adam|multi_tensor|foreach|lamb"),
    ("norm/activation", r"norm|rms|layer_norm|silu|swiglu|gelu|geglu|act"),
    ("loss/softmax", r"cross_entropy|log_softmax|softmax|nll"),
    ("embedding", r"embedding|index|gather|scatter"),
]
OTHER = "other (elementwise, copies, reductions)"
_FP8_TYPES = re.compile(r"e4m3|e5m2|fp8")


def categorize(name: str) -> str:
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            if cat == "gemm":  # a GEMM kernel with FP8 operand types in its name is an FP8 GEMM
                return "fp8 gemm" if _FP8_TYPES.search(low) else "gemm (bf16/fp32)"
            return cat
    return OTHER


def device_times(prof) -> tuple[dict[str, float], str]:
    """{name: microseconds} of GPU kernels if any ran, else of CPU ops (self time); and which."""
    kernels: dict[str, float] = {}
    for evt in prof.key_averages():
        t = getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0)
        # user annotations on the GPU timeline (e.g. "Optimizer.step#AdamW.step") span kernels that
        # are counted on their own: leave them out, or their time counts twice
        if getattr(evt, "is_user_annotation", False) or re.search(r"#\w+\.step$|^ProfilerStep", evt.key):
            continue
        if t and str(getattr(evt, "device_type", "")).endswith("CUDA"):
            kernels[evt.key] = kernels.get(evt.key, 0.0) + t
    if kernels:
        return kernels, "cuda kernels"
    ops = {evt.key: float(evt.self_cpu_time_total) for evt in prof.key_averages()
           if evt.key.startswith("aten::") and evt.self_cpu_time_total > 0}
    return ops, "cpu ops (self time)"


def summarize(prof, steps: int, wall_s: Iterable[float], unprofiled_step_s: Iterable[float] = (),
              top: int = 15) -> dict[str, Any]:
    """A JSON-ready summary of ``steps`` profiled steps.

    ``wall_s``: the profiled steps' wall times (the profiler slows them down a little);
    ``unprofiled_step_s``: the same run's other steady-state step times, for comparison.
    ``gpu_busy`` = kernel time per step / unprofiled step time (or profiled, if none given). Kernels
    on concurrent streams (NCCL next to compute under FSDP2) both count, so it can exceed 1 there.
    """
    if steps < 1:
        raise ValueError(f"summarize: steps must be >= 1, got {steps}")
    times, source = device_times(prof)
    per_step = {k: v / 1e3 / steps for k, v in times.items()}  # ms
    cats: dict[str, float] = {}
    for name, ms in per_step.items():
        cats[categorize(name)] = cats.get(categorize(name), 0.0) + ms
    busy_ms = sum(per_step.values())
    wall = [1e3 * w for w in wall_s]
    other = [1e3 * w for w in unprofiled_step_s]
    ref = statistics.median(other) if other else (statistics.median(wall) if wall else None)
    return {
        "source": source, "steps": steps,
        "time_ms_per_step": busy_ms,
        "profiled_step_ms": statistics.median(wall) if wall else None,
        "unprofiled_step_ms": statistics.median(other) if other else None,
        "gpu_busy": busy_ms / ref if ref and source == "cuda kernels" else None,
        "categories_ms": dict(sorted(cats.items(), key=lambda kv: -kv[1])),
        "top_ms": [[k[:120], v] for k, v in sorted(per_step.items(), key=lambda kv: -kv[1])[:top]],
    }


def format_summary(s: dict[str, Any]) -> str:
    """A few lines for a log: total, busy fraction, categories."""
    lines = [f"{s['time_ms_per_step']:.1f} ms of {s['source']} per step"
             + (f"; step {s['unprofiled_step_ms']:.1f} ms unprofiled" if s.get("unprofiled_step_ms") else "")
             + (f"; GPU busy {100 * s['gpu_busy']:.0f}%" if s.get("gpu_busy") else "")]
    total = s["time_ms_per_step"] or 1.0
    for cat, ms in s["categories_ms"].items():
        lines.append(f"  {cat:<40} {ms:9.1f} ms  {100 * ms / total:5.1f}%")
    return "\n".join(lines)


def start(device):
    """A running torch.profiler (CPU ops, and CUDA kernels on a GPU); stop it with ``__exit__``."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if getattr(device, "type", device) == "cuda" else [])
    prof = profile(activities=acts)
    prof.__enter__()
    return prof


def write(prof, wall_s: list[float], unprofiled_s: list[float], output_dir: Path) -> str:
    """Summarise a stopped profiler into ``output_dir/profile.json``; return the log lines."""
    summary = summarize(prof, len(wall_s), wall_s, unprofiled_s)
    ownership.write_file(Path(output_dir) / "profile.json", json.dumps(summary, indent=1) + "\n")
    if ownership.marker_kind(Path(output_dir)) is not None:
        ownership.record(output_dir, "profile.json")
    return format_summary(summary)
