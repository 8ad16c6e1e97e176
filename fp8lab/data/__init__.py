"""Text to tokens: the tokenizer, token shards and their manifest, the loader (``tokens``: ``fp8lab prepare-data``),
and the checks of ``--data`` before anything is computed (``checks``)."""
from __future__ import annotations
