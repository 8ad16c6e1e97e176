"""fp8lab: learn, convert, train and measure LLMs in FP8 with Transformer Engine.

Heavy pieces (torch, transformers, Transformer Engine) load lazily, so that
``import fp8lab`` and ``fp8lab env`` stay fast and work on any machine.

The package is folders in one import order (``docs/architecture.md``): core < records < model < fp8 < plan <
data < train < analysis < launch < views < the face (``cli``, ``env``, ``notebooks``, ``trainpair``). The public
names below, and the modules that lived at the top before the folders (``from fp8lab import models``), still
import from here.
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

# a module that lived at fp8lab's top level -> where it lives now (``from fp8lab import models`` keeps working)
_MOVED = {
    "paths": "fp8lab.core.paths", "validate": "fp8lab.core.validate", "errors": "fp8lab.core.errors",
    "pins": "fp8lab.core.pins", "probes": "fp8lab.core.probes", "hardware": "fp8lab.core.hardware",
    "ownership": "fp8lab.records.ownership", "runlock": "fp8lab.records.runlock", "metrics": "fp8lab.records.metrics",
    "data_format": "fp8lab.records.data_format", "model_config": "fp8lab.model.config",
    "models": "fp8lab.model.models", "families": "fp8lab.model.families", "rope": "fp8lab.model.rope",
    "model_checks": "fp8lab.model.checks", "user_model": "fp8lab.model.user", "formats": "fp8lab.fp8.formats",
    "recipe": "fp8lab.fp8.recipe", "backends": "fp8lab.fp8.backends", "convert": "fp8lab.fp8.convert",
    "te_debug": "fp8lab.fp8.te_debug", "options": "fp8lab.plan.options",
    "config": "fp8lab.plan.config", "layout": "fp8lab.plan.layout", "graphs": "fp8lab.plan.graphs",
    "fp8attn": "fp8lab.plan.fp8attn", "data_checks": "fp8lab.data.checks", "trainer": "fp8lab.train.trainer",
    "components": "fp8lab.train.components", "checkpoint": "fp8lab.train.checkpoint",
    "te_state": "fp8lab.train.te_state", "resume": "fp8lab.train.resume", "export": "fp8lab.train.export",
    "optim": "fp8lab.train.optim", "distributed": "fp8lab.train.distributed",
    "master_weights": "fp8lab.train.master_weights", "profiling": "fp8lab.train.profiling",
    "run_paths": "fp8lab.train.run_paths", "sm_entry": "fp8lab.train.sm_entry",
    "estimates": "fp8lab.analysis.estimates", "scaling": "fp8lab.analysis.scaling", "plots": "fp8lab.views.plots",
    "report": "fp8lab.views.report", "formats_viz": "fp8lab.views.formats",
}


# a top-level module that became a feature's rule, mechanism and reader -> those modules: the old name holds the
# public names of all three (``fp8lab.fp8stats.table`` keeps working; code inside fp8lab imports the modules)
_SPLIT = {"fp8stats": ("fp8lab.fp8.stats", "fp8lab.plan.fp8_stats", "fp8lab.analysis.fp8_stats")}


def __getattr__(name):  # PEP 562: resolved on first use (torch and transformers load only then)
    import importlib

    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name]), name)
    if name in _MOVED:
        return importlib.import_module(_MOVED[name])
    if name in _SPLIT:
        import types

        merged = types.ModuleType(f"fp8lab.{name}", f"{name}: the names of {', '.join(_SPLIT[name])}")
        for module in map(importlib.import_module, _SPLIT[name]):
            merged.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
        globals()[name] = merged
        return merged
    raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
