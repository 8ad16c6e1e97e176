"""Text to tokens: the tokenizer, token shards and their manifest, the loader (``tokens``: ``fp8lab prepare-data``),
and the checks of ``--data`` before anything is computed (``checks``).

The names of the old top-level data module (now ``tokens`` here) still import from this package."""
from __future__ import annotations

from fp8lab.core.lazy import old_module_names

__getattr__ = old_module_names(__file__, __name__, "fp8lab.data.tokens")  # numpy and tokenizers stay off the checks' import path
