"""The long-context study's result files read back: per sequence length, BF16 and FP8 with FP8 attention
off and on (``study_runs``), and their tokens/s and speed-ups as a table (``speedup_table``), which
``fp8lab.views.plots.long_context_figure`` draws and ``benchmarks/long_context.py`` turns into the crossover that
``--fp8-attention auto`` follows (through the packaged evidence: ``fp8lab.plan.evidence``)."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from fp8lab.analysis.load import read_jsonl
from fp8lab.core.paths import RESULTS_DIR
from fp8lab.plan.evidence import FP8_ATTENTION_STUDY

STUDY_DIR = RESULTS_DIR / FP8_ATTENTION_STUDY  # data/results/long-context-h200/
ROLES = {"default-bf16": "bf16", "default-fp8-noattn": "fp8", "default-fp8-attn": "fp8_attn"}  # throughput.py variants


def _read(path: Path) -> dict:
    """One result file (data/results/README.md): its run record, summary and step records."""

    lines = [r for _, r in read_jsonl(path)]
    one = {r["record"]: r for r in lines if r.get("record") in ("run", "summary")}
    return {"run": one["run"], "summary": one.get("summary", {}),
            "steps": [r for r in lines if r.get("record") == "step"]}


def study_runs(folder: Path = STUDY_DIR, tag: str = "3b") -> dict[int, dict[str, dict]]:
    """seq_len -> role (bf16 | fp8 | fp8_attn) -> result file, for the study's runs tagged ``<tag>-s<N>``."""
    out: dict[int, dict[str, dict]] = {}
    for f in sorted(Path(folder).glob("*.jsonl")) if Path(folder).is_dir() else ():
        rec = _read(f)
        m = re.fullmatch(r"(default-[a-z0-9-]+?)-" + re.escape(tag) + r"-s(\d+)", rec["run"].get("variant", ""))
        if m and m.group(1) in ROLES:
            out.setdefault(int(m.group(2)), {})[ROLES[m.group(1)]] = rec
    return out


def speedup_table(folder: Path = STUDY_DIR, tag: str | tuple[str, ...] = ("3b", "7b")):
    """One row per model, sequence length and FP8 role: tokens/s/GPU and the ratio over BF16 at that length (a
    DataFrame; empty before the study is committed), for the runs tagged ``tag`` (the study's 3B shape and
    llama-7b by default). ``fp8lab.views.plots.long_context_figure`` draws it."""
    rows = []
    for t in (tag,) if isinstance(tag, str) else tag:
        for seq, roles in sorted(study_runs(folder, t).items()):
            bf16 = roles.get("bf16", {}).get("summary", {}).get("tokens_per_sec_per_gpu")
            for role in ("fp8", "fp8_attn"):
                if role in roles and bf16:
                    tps = roles[role]["summary"]["tokens_per_sec_per_gpu"]
                    rows.append({"seq_len": seq, "role": role, "tokens_per_sec_per_gpu": tps,
                                 "bf16_tokens_per_sec_per_gpu": bf16, "speedup": tps / bf16,
                                 "model": roles[role]["run"].get("model"),
                                 "gpu_name": roles[role]["run"].get("gpu_name"),
                                 "grad_accum": roles[role]["run"].get("grad_accum"),
                                 "run_id": roles[role]["run"].get("run_id")})
    return pd.DataFrame(rows, columns=["seq_len", "role", "tokens_per_sec_per_gpu", "bf16_tokens_per_sec_per_gpu",
                                       "speedup", "model", "gpu_name", "grad_accum", "run_id"])
