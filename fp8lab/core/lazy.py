"""A package's ``__getattr__`` (PEP 562) for the names of the module it replaced: ``fp8lab.plan``, ``fp8lab.train``
and ``fp8lab.data`` were modules before the folders, and their names still import from the package, loaded on first
use (so importing one module of the folder loads no others)."""
from __future__ import annotations

import importlib
from pathlib import Path


def old_module_names(package_file: str, package: str, home: str):
    """The ``__getattr__`` of the package at ``package_file``: a name the old module had comes from ``home``; a
    module of the folder is left to the import system."""
    def __getattr__(name):
        if name.startswith("__") or Path(package_file).with_name(name + ".py").is_file():
            raise AttributeError(name)  # a module of this folder: the import system loads it
        try:
            return getattr(importlib.import_module(home), name)
        except AttributeError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    return __getattr__
