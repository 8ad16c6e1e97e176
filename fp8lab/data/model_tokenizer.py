"""Which tokenizer a run's text goes through: the model folder's own, or fp8lab's byte-level BPE.

A ``--model`` folder (or ``hf:`` snapshot) that holds tokenizer files (``fp8lab.model.user.TOKENIZER_FILES``) is a
pretrained model's: its data is tokenized with that tokenizer (transformers ``AutoTokenizer``, local files only, no
code from the folder), so the token ids mean what they meant to the checkpoint. The named shapes and folders without
tokenizer files use fp8lab's BPE tokenizer (``fp8lab.data.tokens``), as before.

The choice is recorded as the manifest's ``tokenizer_source`` (``BPE_SOURCE``, or the folder's name and a digest of its
tokenizer files and chat template), so a token cache made with one tokenizer (or template) is never reused for
another and the data's identity (a checkpoint's fingerprint) differs between them.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from fp8lab.data import tokens as fdata
from fp8lab.data.tokens import BPE_SOURCE
from fp8lab.model import checks as model_checks
from fp8lab.model import user as user_model


def folder(model: str | None) -> Path | None:
    """The model folder whose tokenizer the run uses, or None (fp8lab's BPE: a named shape, or no tokenizer files)."""
    if model is None or not user_model.is_user_model(model):
        return None
    where = user_model.folder_of(model)
    return where if any((where / n).is_file() for n in user_model.TOKENIZER_FILES) else None


def foreign_ids(model: str | None) -> bool:
    """``model`` is a folder with trained weights but no tokenizer: fp8lab's BPE tokenizes its data, with ids that
    mean nothing to those weights (a new vocabulary learnt over them, not a fine-tune)."""
    return (model is not None and user_model.is_user_model(model) and folder(model) is None
            and model_checks.has_weights(user_model.folder_of(model)))


def source(model: str | None) -> dict[str, Any]:
    """What the manifest records as the tokenizer: ``BPE_SOURCE``, or the folder's name and its tokenizer files'
    SHA-256 (the name never a machine path)."""
    where = folder(model)
    if where is None:
        return dict(BPE_SOURCE)
    h = hashlib.sha256()
    names = [n for n in user_model.TOKENIZER_FOLDER_FILES if (where / n).is_file()]  # a new template: new tokens
    for n in names:
        h.update(n.encode() + b"\0" + (where / n).read_bytes() + b"\0")
    return {"kind": "model", "name": model if model.startswith(user_model.HF_PREFIX) else where.name,
            "files": names, "sha256": h.hexdigest()}


def load(model: str | None, vocab_size: int = fdata.DEFAULT_VOCAB):
    """The run's tokenizer as a transformers fast tokenizer: the folder's (``AutoTokenizer``, local files only), or
    fp8lab's BPE for ``min(vocab_size, 32000)`` wrapped with ``<|endoftext|>`` as its end-of-text token. A folder
    tokenizer that does not load, or loads only as a slow (Python) tokenizer, is a ValueError naming the folder."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    where = folder(model)
    if where is None:
        bpe = fdata.load_tokenizer(None, min(vocab_size, fdata.DEFAULT_VOCAB))
        return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=fdata.EOS_TOKEN)
    try:
        tok = AutoTokenizer.from_pretrained(str(where), local_files_only=True, trust_remote_code=False)
    except Exception as exc:  # noqa: BLE001 - any failure of the folder's files is one line
        said = " ".join(str(exc).split())[:200]
        raise ValueError(f"--model={model!r}: its tokenizer files do not load with transformers' AutoTokenizer "
                         f"({type(exc).__name__}: {said}); allowed: a folder written by save_pretrained with "
                         "tokenizer.json, or one without tokenizer files (fp8lab's tokenizer is then used)") from None
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"--model={model!r}: its tokenizer loads only as a slow (Python) tokenizer "
                         f"({type(tok).__name__}); allowed: a folder with tokenizer.json (a fast tokenizer)")
    return tok


def check_fits(model: str | None, tokenizer, vocab_size: int) -> None:
    """The tokenizer's ids fit the model's embedding (``vocab_size`` rows), else a ValueError naming both sizes."""
    n = len(tokenizer)
    if n > vocab_size:
        raise ValueError(f"--model={model!r}: its tokenizer has {n} tokens (ids 0..{n - 1}) but its config.json has "
                         f"vocab_size {vocab_size}: ids past the embedding table cannot be trained; allowed: a "
                         f"tokenizer of at most {vocab_size} tokens, or a config.json with vocab_size >= {n}")
