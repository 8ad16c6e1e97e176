"""fp8lab: learn, convert, train and measure LLMs in FP8 with Transformer Engine.

Heavy pieces (torch, transformers, Transformer Engine) load lazily, so that
``import fp8lab`` and ``fp8lab env`` stay fast and work on any machine.
"""
from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["autocast", "convert_model", "Recipe", "available_backends", "__version__"]


def __getattr__(name):  # PEP 562: resolve the conversion API on first use
    if name in ("autocast", "convert_model", "Recipe", "available_backends"):
        from fp8lab.fp8 import convert

        return getattr(convert, name)
    raise AttributeError(f"module 'fp8lab' has no attribute {name!r}")
