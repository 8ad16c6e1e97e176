"""Training: the entry points (``entry``: ``fp8lab train``, ``python -m fp8lab.train``), the ``Trainer`` and its
components, checkpoints, export, distributed wrapping, master weights, profiling, a run's folders and the
SageMaker entry script (``sm_entry``).

The names of the old top-level train module (now ``entry`` here) still import from this package."""
from __future__ import annotations

import importlib
from pathlib import Path

_HOME = "fp8lab.train.entry"


def __getattr__(name):  # PEP 562: the old module's names, loaded on first use (importing one training module loads no others)
    if name.startswith("__") or (Path(__file__).with_name(name + ".py")).is_file():
        raise AttributeError(name)  # a module of this folder: the import system loads it
    try:
        return getattr(importlib.import_module(_HOME), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
