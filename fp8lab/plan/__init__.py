"""The run plan, torch-free: the option schema and vocabularies (``options``), ``TrainConfig`` (``config``), the
layout resolver (``layout``), CUDA graphs' and FP8 attention's rules (``graphs``, ``fp8attn``), the committed GPU
checks' values (``evidence``) and ``plan_run(config, machine, evidence) -> RunPlan`` (``runplan``): every effective
decision once, with its reason."""
from __future__ import annotations
