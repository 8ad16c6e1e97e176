"""Where an FP8 run keeps its decoder blocks' weights: as bf16 weights cast to FP8 (``cast``) or only in FP8
(``primary``).

``cast`` is what every run did before: each block linear keeps its bf16 weight, and TE casts it to FP8 (with the
weight cache, once per step: the FP8 copy and its transpose, about 2 bytes per block weight beside the bf16 2). So
FP8 keeps more weight bytes than BF16, and "FP8 did not lower my memory" is true of it.

``primary`` keeps each block linear's weight only as an FP8 tensor (Transformer Engine's ``Float8Tensor``, one byte
per weight, rowwise only), written from the fp32 master after each optimizer step (fp8lab.train.fp8_weights). The
bf16 copy and the cache are gone; each backward makes the transposes it needs and they are dropped after it, so the
forward's peak holds one byte per block weight, not four. It needs fp32 masters kept elsewhere: ``--memory offload``
(fp8lab.plan.memory_modes), where they are in host memory. The FP8 values are the ones ``cast`` makes from the same
bf16-rounded master under current scaling (a per-tensor scale from the weight's own amax); under delayed scaling
``cast`` scales weights from an amax history and ``primary`` from the weight's own amax, a difference its loss check
measures.

``auto`` takes ``primary`` where it can run once its loss check against ``cast`` holds (fp8lab.plan.evidence), and
``cast`` until then.
"""
from __future__ import annotations

from fp8lab.core.validate import AUTO
from fp8lab.plan import memory_modes

CAST = "cast"
PRIMARY = "primary"
CHOICES = (AUTO, CAST, PRIMARY)


def problem(*, precision: str, backend: str | None, fuse: bool, memory_mode: str, lora: bool,
            graphs: bool = False, ranks: int = 1) -> str | None:
    """Why the blocks' weights cannot be kept only in FP8 in this run (None: they can); ``ranks``: its processes."""
    if precision != "fp8":
        return "only an FP8 run keeps FP8 weights"
    if backend != "te" or not fuse:
        return "needs Transformer Engine's fused blocks (--backend te, --fuse auto)"
    if lora:
        return "LoRA's frozen base keeps no fp32 masters to write the FP8 weights from"
    if ranks > 1:
        return "runs in one process (DDP broadcasts and buckets plain tensors, not FP8 ones)"
    if graphs:
        return "CUDA graphs replay the backward's transposes at fixed addresses, which this frees after each backward"
    if not memory_modes.get(memory_mode).offloaded:
        return (f"needs the fp32 masters kept off the GPU (--memory {memory_modes.OFFLOAD}); under --memory "
                f"{memory_mode} the bf16 weights are what the optimizer steps")
    return None


def applies(requested: str, *, precision: str, backend: str | None, fuse: bool, memory_mode: str,
            lora: bool, ranks: int = 1) -> bool:
    """Whether a run asking for ``requested`` (``auto`` resolved: :func:`resolved`) keeps the blocks' weights only in
    FP8 (the memory estimate's rule; never raises)."""
    return requested == PRIMARY and problem(precision=precision, backend=backend, fuse=fuse, memory_mode=memory_mode,
                                            lora=lora, ranks=ranks) is None


def resolved(requested: str, checked: bool) -> str:
    """What ``--fp8-weights requested`` asks for where it can run: ``auto`` is ``primary`` once its loss check holds
    (``checked``, fp8lab.plan.evidence), else ``cast``."""
    if requested != AUTO:
        return requested
    return PRIMARY if checked else CAST


def decide(requested: str, *, precision: str, backend: str | None, fuse: bool, memory_mode: str,
           lora: bool, checked: bool, graphs: bool = False, ranks: int = 1) -> tuple[bool, str]:
    """(the blocks' weights are kept only in FP8, why) for ``--fp8-weights requested``; ``checked``: primary's loss
    check is committed and holds (fp8lab.plan.evidence). ValueError for ``primary`` in an FP8 run where it cannot
    run, naming why and what can; a BF16 run (the other half of a pair) keeps bf16 weights whatever was asked."""
    why_not = problem(precision=precision, backend=backend, fuse=fuse, memory_mode=memory_mode, lora=lora,
                      graphs=graphs, ranks=ranks)
    if precision != "fp8":
        return False, f"bf16 weights ({why_not})"
    if requested == PRIMARY:
        if why_not:
            raise ValueError(f"--fp8-weights {PRIMARY} {why_not}; allowed here: {AUTO} | {CAST}")
        return True, (f"--fp8-weights {PRIMARY}: the blocks' weights only in FP8 (1 byte each, written from the "
                      "fp32 masters each step; no bf16 copy, no FP8 cache)")
    if requested == CAST:
        return False, f"--fp8-weights {CAST}: bf16 weights cast to FP8"
    if why_not:
        return False, f"auto: bf16 weights cast to FP8 ({why_not})"
    if checked:
        return True, ("auto: the blocks' weights only in FP8 (1 byte each, no bf16 copy, no FP8 cache; its loss "
                      "check against the cast weights holds)")
    return False, (f"auto: bf16 weights cast to FP8 (--fp8-weights {PRIMARY} keeps them only in FP8; auto takes it "
                   "once its loss check is committed)")
