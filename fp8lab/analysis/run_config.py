"""A run folder's config.json as readers take it: today's form (fp8lab.train.run_record), old folders' too.

Today's config.json keeps each decision once: the options as flat keys (at the value that ran), ``requested``,
``plan`` (every decision and why) and ``built`` (what the trainer refined). Run folders written before that kept
them again as ``*_resolved`` / ``*_active`` keys, ``cuda_graphs_reason``/``cuda_graphs_captured``,
``requested_layout`` and ``layout``: :func:`normalize_config` moves those into ``plan``, ``built`` and
``requested``, so one reader reads both. The flat keys are left as they were (fp8lab.analysis.load's columns
come from them).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# old flat key -> its key in "plan" / in "built"
OLD_PLAN_KEYS = {"backend_resolved": "backend", "recipe_resolved": "recipe", "total_steps": "total_steps",
                 "warmup_steps_resolved": "warmup_steps", "compute_dtype_resolved": "compute_dtype",
                 "tokens_per_step": "tokens_per_step", "cuda_graphs_active": "cuda_graphs"}
OLD_BUILT_KEYS = {"fp8_weight_cache_active": "fp8_weight_cache", "fuse_wgrad_accumulation_active": "fuse_wgrad_accumulation",
                  "fsdp_keep_weights_active": "fsdp_keep_weights", "adamw_impl": "adamw_impl",
                  "cuda_graphs_captured": "cuda_graphs_captured"}
OLD_NESTED = ("cuda_graphs_reason", "requested_layout", "layout")


def normalize_config(raw: Any) -> Any:
    """``raw`` (a config.json's object) in today's form: an old folder's repeated keys moved into ``plan``, ``built``
    and ``requested`` (a value already there wins); today's form comes back equal. Not a dict: returned as is."""
    if not isinstance(raw, dict) or not any(k in raw for k in (*OLD_PLAN_KEYS, *OLD_BUILT_KEYS, *OLD_NESTED)):
        return raw
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
