"""Text to tokens: the tokenizer, token shards and their manifest, the loader (``tokens``: ``fp8lab prepare-data``),
and the checks of ``--data`` before anything is computed (``checks``).

The names of the old top-level data module (now ``tokens`` here) still import from this package."""
from __future__ import annotations

import importlib
from pathlib import Path

_HOME = "fp8lab.data.tokens"


def __getattr__(name):  # PEP 562: the old module's names, loaded on first use (numpy and tokenizers stay off the checks' import path)
    if name.startswith("__") or (Path(__file__).with_name(name + ".py")).is_file():
        raise AttributeError(name)  # a module of this folder: the import system loads it
    try:
        return getattr(importlib.import_module(_HOME), name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
