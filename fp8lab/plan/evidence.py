"""The measured evidence ``auto`` decisions follow, as values the plan is given.

Some ``auto`` rules wait for a GPU check before they turn a feature on: FP8 attention (its crossover and its loss
check), torchao's FP8 all-gather under FSDP2, Transformer Engine's debug API as the FP8 health source, the LM
head's GEMMs in FP8 in the fused loss's chunks, and the blocks' weights kept only in FP8. Their
outcomes are a few values, kept in ``evidence.json`` beside this module (package data: a wheel, a checkout and a
SageMaker job's code channel carry the same file). ``fp8lab report --docs`` writes it from ``data/results/``
(:func:`render`), and a test ties the committed copy to those files.

:func:`load` reads it, on the first call, into a frozen :class:`Evidence` that ``plan_run(config, machine,
evidence)`` receives; nothing here is read at import. ``Evidence()`` is a checkout with no check committed.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

FILE = "evidence.json"  # in this package (fp8lab/plan/), written by `fp8lab report --docs`
DOC = "fp8lab/plan/" + FILE  # its path in the checkout that `fp8lab report --docs` writes into

# The result folders under data/results/ each value comes from (the benchmark that writes them: their README).
FP8_ATTENTION_STUDY = "long-context-h200"  # crossover.json (speed by sequence length), loss.json (the loss check)
FP8_ALL_GATHER_STUDY = "fp8-all-gather-h200"  # check.json (benchmarks/fp8_all_gather_check.py)
TE_DEBUG_STUDY = "fp8stats-sources"  # check.json (benchmarks/fp8stats_overhead.py --check)
# loss.json (benchmarks/memory_modes_loss.py): each mode's loss check against the plain runs of its own folder (the
# same code); a later folder's verdict on a mode replaces an earlier one's
MEMORY_MODES_STUDIES = ("memory-modes-h100", "memory-offload-h100")
FP8_HEAD_STUDY = "fp8-head-chunks-h100"  # check.json (benchmarks/fp8_head_check.py): GPU tests, speed and loss
# loss.json (benchmarks/memory_modes_loss.py <folder> te-fp8-delayed-fp8w- cast): --fp8-weights primary against cast
FP8_WEIGHTS_STUDY = "fp8-weights-h100"


@dataclass(frozen=True)
class Evidence:
    """What the committed GPU checks say; the defaults are "nothing committed"."""

    fp8_attention_crossover: int | None = None  # the shortest sequence from which FP8 attention was measured faster
    fp8_attention_loss: bool | None = None  # its loss check holds (None: not committed)
    fp8_all_gather: bool = False  # torchao's FP8 all-gather passed its GPU check
    te_debug: bool = False  # TE's debug API passed its GPU check (every step recorded, cost within the goal)
    te_debug_problems: tuple[str, ...] = ()  # why that check failed (empty: passed, or not committed)
    te_debug_te: str | None = None  # the Transformer Engine release the check ran on
    memory_modes: tuple[str, ...] = ()  # the memory modes whose loss stayed inside the seeds' band (auto may use them)
    memory_mode_gaps: tuple[tuple[str, float], ...] = ()  # each checked mode's loss gap to plain, percent
    fp8_head: bool = False  # the LM head's FP8 GEMMs in the loss's chunks passed their GPU check (tests, speed, loss)
    fp8_weights: bool = False  # --fp8-weights primary's loss stayed inside the cast weights' seed band

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Evidence":
        attn, gather, debug = (data.get(k) or {} for k in ("fp8_attention", "fp8_all_gather", "te_debug"))
        crossover = attn.get("crossover_seq_len")
        loss = attn.get("loss_holds")
        return cls(fp8_attention_crossover=None if crossover is None else int(crossover),
                   fp8_attention_loss=None if loss is None else bool(loss),
                   fp8_all_gather=gather.get("passed") is True, te_debug=debug.get("passed") is True,
                   te_debug_problems=tuple(str(p) for p in debug.get("problems") or ()),
                   te_debug_te=debug.get("transformer_engine"),
                   memory_modes=tuple(str(m) for m in (data.get("memory_modes") or {}).get("holds") or ()),
                   memory_mode_gaps=tuple(sorted((str(m), float(g)) for m, g in
                                                 ((data.get("memory_modes") or {}).get("gap_pct") or {}).items())),
                   fp8_head=(data.get("fp8_head") or {}).get("passed") is True,
                   fp8_weights=(data.get("fp8_weights") or {}).get("passed") is True)


def _read(path: Path) -> dict | None:
    """A committed check's JSON object, or None where it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def from_results(results_dir: str | Path) -> dict[str, Any]:
    """The evidence as ``evidence.json`` holds it, from the result files under ``results_dir`` (``data/results``)."""
    results = Path(results_dir)
    crossover = _read(results / FP8_ATTENTION_STUDY / "crossover.json") or {}
    loss = _read(results / FP8_ATTENTION_STUDY / "loss.json")
    gather = _read(results / FP8_ALL_GATHER_STUDY / "check.json") or {}
    debug = _read(results / TE_DEBUG_STUDY / "check.json")
    modes: dict[str, dict] = {}
    for study in MEMORY_MODES_STUDIES:
        modes.update((_read(results / study / "loss.json") or {}).get("modes") or {})
    head = _read(results / FP8_HEAD_STUDY / "check.json")
    primary = ((_read(results / FP8_WEIGHTS_STUDY / "loss.json") or {}).get("modes") or {}).get("primary")
    return {
        "fp8_attention": {
            "study": FP8_ATTENTION_STUDY,
            "crossover_seq_len": crossover.get("crossover_seq_len"),
            # its "holds" (the gap within max(0.5%, the seed noise)); a file without it: the 0.5% bound alone
            "loss_holds": None if loss is None else bool(loss["holds"] if "holds" in loss
                                                         else loss.get("within_bound", False))},
        "fp8_all_gather": {"study": FP8_ALL_GATHER_STUDY, "passed": gather.get("passed") is True},
        "te_debug": {"study": TE_DEBUG_STUDY, "committed": debug is not None,
                     "passed": (debug or {}).get("passed") is True,
                     "problems": [str(p) for p in (debug or {}).get("problems") or []],
                     "transformer_engine": (debug or {}).get("transformer_engine")},
        "memory_modes": {"studies": list(MEMORY_MODES_STUDIES),
                         "holds": sorted(m for m, r in modes.items() if r.get("holds") is True),
                         "gap_pct": {m: round(float(r["gap_pct"]), 2) for m, r in modes.items()
                                     if r.get("gap_pct") is not None}},
        "fp8_head": {"study": FP8_HEAD_STUDY, "committed": head is not None,
                     "passed": (head or {}).get("passed") is True},
        "fp8_weights": {"study": FP8_WEIGHTS_STUDY, "committed": primary is not None,
                        "passed": (primary or {}).get("holds") is True},
    }


def render(results_dir: str | Path) -> str:
    """``evidence.json``'s text for the result files under ``results_dir``."""
    return json.dumps(from_results(results_dir), indent=1, sort_keys=True) + "\n"


@functools.lru_cache(maxsize=None)
def _packaged() -> Evidence:
    text = resources.files(__package__).joinpath(FILE).read_text(encoding="utf-8")
    return Evidence.from_dict(json.loads(text))


def load(path: str | Path | None = None) -> Evidence:
    """The evidence in ``path`` (default: the packaged ``evidence.json``, read once per process)."""
    if path is None:
        return _packaged()
    return Evidence.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))
