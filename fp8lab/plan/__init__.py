"""The run plan, torch-free: the option schema and vocabularies (``options``), ``TrainConfig`` (``config``), the
layout resolver (``layout``), CUDA graphs' and FP8 attention's rules (``graphs``, ``fp8attn``) and
``plan_run(config, machine) -> RunPlan`` (``runplan``): every effective decision once, with its reason.

The names of the old top-level plan module (now ``runplan`` here) still import from this package."""
from __future__ import annotations

import importlib
from pathlib import Path

_HOME = "fp8lab.plan.runplan"


def __getattr__(name):  # PEP 562: the old module's names, loaded on first use (importing fp8lab.plan.options loads no more than it needs)
    if name.startswith("__") or (Path(__file__).with_name(name + ".py")).is_file():
        raise AttributeError(name)  # a module of this folder: the import system loads it
    try:
        return getattr(importlib.import_module(_HOME), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
