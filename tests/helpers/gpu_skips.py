"""Skips shared by the GPU tests: one reason, written once."""
from __future__ import annotations

import pytest


def te_or_skip() -> None:
    """Skip the calling test where fp8lab's Transformer Engine backend cannot run, naming why."""
    from fp8lab.fp8.backends import get_backend

    reason = get_backend("te").available()
    if reason:
        pytest.skip(f"te backend not usable: {reason}")
