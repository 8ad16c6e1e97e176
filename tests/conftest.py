"""Shared test set-up: the ``gpu`` marker skips, with a reason, where no CUDA GPU exists."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _gpu_reason() -> str | None:
    try:
        import torch
    except Exception as exc:  # pragma: no cover - torch is a hard dependency
        return f"torch does not import: {exc}"
    if not torch.cuda.is_available():
        return "needs a CUDA GPU (none on this machine; run on the H200 through the device tool)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
