"""The run plan, torch-free: the option schema and vocabularies (``options``), ``TrainConfig`` (``config``), the
layout resolver (``layout``), CUDA graphs' and FP8 attention's rules (``graphs``, ``fp8attn``) and
``plan_run(config, machine) -> RunPlan`` (``runplan``): every effective decision once, with its reason.

The names of the old top-level plan module (now ``runplan`` here) still import from this package."""
from __future__ import annotations

from fp8lab.core.lazy import old_module_names

__getattr__ = old_module_names(__file__, __name__, "fp8lab.plan.runplan")  # importing fp8lab.plan.options loads no more than it needs
