"""Text to tokens: the tokenizer, token shards and their manifest, the loader (``tokens``), the checks of ``--data``
before anything is computed (``checks``), a model folder's own tokenizer (``model_tokenizer``), instruction data
(``sft``), and what a run reads for its task and tokenizer (``run_data``: ``fp8lab prepare-data``)."""
from __future__ import annotations
