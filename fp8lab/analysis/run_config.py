"""A run folder's config.json as readers take it: today's form (fp8lab.train.run_record), old folders' too.

Today's config.json keeps each decision once: the options as flat keys (at the value that ran), ``requested``,
``plan`` (every decision and why) and ``built`` (what the trainer refined). Run folders written before that kept
them again as ``*_resolved`` / ``*_active`` keys, ``cuda_graphs_reason``/``cuda_graphs_captured``,
``requested_layout`` and ``layout``: :func:`normalize_config` moves those into ``plan``, ``built`` and
``requested``, so one reader reads both. Their flat keys could say "auto" for an option the plan decided (the
backend, the recipe, the compute dtype, CUDA graphs, FP8 all-gather): it puts the value that ran there, from the
plan kept beside them (fp8lab.analysis.load's columns come from the flat keys). The same reader takes a result
file's run record, whose earliest FP8-head files named ``--fp8-lm-head True`` in their command only.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# old flat key -> its key in "plan" / in "built"
OLD_PLAN_KEYS = {"backend_resolved": "backend", "recipe_resolved": "recipe", "total_steps": "total_steps",
                 "warmup_steps_resolved": "warmup_steps", "compute_dtype_resolved": "compute_dtype",
                 "tokens_per_step": "tokens_per_step", "cuda_graphs_active": "cuda_graphs"}
OLD_BUILT_KEYS = {"fp8_weight_cache_active": "fp8_weight_cache",
                  "fuse_wgrad_accumulation_active": "fuse_wgrad_accumulation",
                  "fsdp_keep_weights_active": "fsdp_keep_weights", "adamw_impl": "adamw_impl",
                  "cuda_graphs_captured": "cuda_graphs_captured"}
OLD_NESTED = ("cuda_graphs_reason", "requested_layout", "layout")


def normalize_config(raw: Any) -> Any:
    """``raw`` (a config.json's object, or a result file's run record) in today's form: an old folder's repeated
    keys moved into ``plan``, ``built`` and ``requested`` (a value already there wins), its "auto" flat keys set to
    what ran; today's form comes back equal. Not a dict: returned as is."""
    if not isinstance(raw, dict):
        return raw
    if "fp8_lm_head" not in raw and "--fp8-lm-head True" in str(raw.get("command", "")):
        raw = {**raw, "fp8_lm_head": True}
    if any(k in raw for k in (*OLD_PLAN_KEYS, *OLD_BUILT_KEYS, *OLD_NESTED)):
        raw = _moved(raw)
    return _ran(raw) if any(raw.get(k) == AUTO for k in DECIDED) else raw


AUTO = "auto"
DECIDED = ("backend", "recipe", "compute_dtype", "cuda_graphs", "fp8_all_gather")  # flat keys once written as asked


def _ran(raw: dict) -> dict:
    """An old config.json's "auto" flat keys at the value that ran, read from its plan (``plan``); a folder older
    than a plan's compute dtype ran bf16 on a GPU and fp32 on a CPU."""
    plan, out = raw.get("plan") or {}, dict(raw)
    backend = plan.get("backend")
    if out.get("backend") == AUTO and backend is not None:
        out["backend"] = backend
    if out.get("recipe") == AUTO and "recipe" in plan:  # plan's recipe: described ("delayed scaling, ..."), or None
        fp8 = out.get("precision") == "fp8" and plan["recipe"] is not None
        out["recipe"] = str(plan["recipe"]).split(" ", 1)[0] if fp8 else None
    if out.get("compute_dtype") == AUTO:
        on_cpu = str(out.get("gpu_name", plan.get("gpu_name", ""))).lower() == "cpu"
        out["compute_dtype"] = plan.get("compute_dtype") or ("fp32" if on_cpu else "bf16")
    for key in ("cuda_graphs", "fp8_all_gather"):
        if out.get(key) == AUTO and isinstance(plan.get(key), bool):
            out[key] = "on" if plan[key] else "off"
    return out


def _moved(raw: dict) -> dict:
    """An old folder's repeated keys moved into ``plan``, ``built`` and ``requested``."""
    out = {k: v for k, v in raw.items() if k not in OLD_PLAN_KEYS and k not in OLD_BUILT_KEYS and k not in OLD_NESTED
           and k not in ("requested", "plan", "built")}
    layout = raw.get("layout") if isinstance(raw.get("layout"), dict) else {}
    plan = dict(raw.get("plan") or {})
    for old, new in OLD_PLAN_KEYS.items():
        if old in raw:
            plan.setdefault(new, raw[old])
    reasons = dict(plan.get("reasons") or {})
    for k, v in (layout.get("reasons") or {}).items():
        reasons.setdefault(k, v)
    if "cuda_graphs_reason" in raw:
        reasons.setdefault("cuda_graphs", raw["cuda_graphs_reason"])
    plan["reasons"] = reasons
    for k in ("memory_gib", "memory_estimate_peak_gib", "memory_estimate_gib"):
        if k in layout:
            plan.setdefault(k, layout[k])
    requested = dict(raw.get("requested") or {})
    for k, v in (raw.get("requested_layout") or {}).items():
        requested.setdefault(k, v)
    built = dict(raw.get("built") or {})
    for old, new in OLD_BUILT_KEYS.items():
        if old in raw:
            built.setdefault(new, raw[old])
    if requested:
        out["requested"] = requested
    return {**out, "plan": plan, "built": built}


def read_config(folder: str | Path) -> dict[str, Any]:
    """A run folder's config.json, in today's form (:func:`normalize_config`)."""
    return normalize_config(json.loads((Path(folder) / "config.json").read_text()))
