"""The Answer of the committed result files, read once per test process (several test modules ask for it)."""
from __future__ import annotations

import functools

from fp8lab import analysis


@functools.lru_cache(maxsize=1)
def committed_answer() -> analysis.Answer:
    summary = analysis.summarize_runs(analysis.load_runs())
    return analysis.Answer.of(summary, reference=analysis.load_reference())
