"""fp8lab: learn, convert, train and measure LLMs in FP8 with Transformer Engine.

Heavy pieces (torch, transformers, Transformer Engine) load lazily, so that
``import fp8lab`` and ``fp8lab env`` stay fast and work on any machine.

The package is folders in one import order (``docs/architecture.md``): core < records < model < fp8 < plan <
data < train < analysis < launch < views < the face (``cli``, ``env``, ``notebooks``, ``trainpair``). The public
names below import from here.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["autocast", "convert_model", "Recipe", "available_backends", "build_model", "get_config",
           "TrainConfig", "plan_run", "RunPlan", "__version__"]

# public name -> the module that owns it
_NAMES = {
    "autocast": "fp8lab.fp8.convert", "convert_model": "fp8lab.fp8.convert", "Recipe": "fp8lab.fp8.convert",
    "available_backends": "fp8lab.fp8.convert", "build_model": "fp8lab.model.models",
    "get_config": "fp8lab.model.models", "TrainConfig": "fp8lab.plan.config", "plan_run": "fp8lab.plan.runplan",
    "RunPlan": "fp8lab.plan.runplan",
}


def __getattr__(name):  # PEP 562: resolved on first use (torch and transformers load only then)
    import importlib

    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
