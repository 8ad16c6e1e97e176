"""The error a run raises when it cannot start as configured (``fp8lab train`` exits 2 on it)."""
from __future__ import annotations


class OptionError(ValueError):
    """A run that cannot start as configured (bad option, unusable backend, data/model mismatch)."""


class RefusedOnRankZero(OptionError):
    """Rank 0's refusal, raised on the other ranks of a multi-process run so that each ends alike (the message was
    said once, by rank 0)."""
