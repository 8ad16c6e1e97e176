"""Memory modes: how many bytes of model state each trainable parameter keeps on the GPU, and the rule that picks one.

A run with bf16 parameters keeps, per parameter, the bf16 weight and its bf16 gradient (2 + 2 bytes), an fp32 master
copy (4) and AdamW's two moments (4 + 4): 16 bytes, so a 7B model's states alone take about 100 GiB and no H100 80 GB
can train it, in BF16 or FP8. FP8 does not shrink these states: it changes the GEMMs' inputs, not what the optimizer
keeps. The modes below keep less, with Transformer Engine's ``FusedAdam`` (the library's kernels, not fp8lab's):

- ``plain``: fp8lab's own bf16 parameters + fp32 masters + fp32 AdamW (fp8lab.train.master_weights), 16 bytes.
- ``fp32-moments``: FusedAdam keeps the fp32 master exactly, as the bf16 weight plus its 16 low bits
  (``store_param_remainders``), and both moments in fp32: 2 + 2 + 2 + 4 + 4 = 14 bytes. It differs from ``plain``
  only in the optimizer's implementation and the bf16 gradient: its loss check tells that apart from the moments'
  precision in the modes below.
- ``bf16-moments``: as ``fp32-moments`` with both moments in bf16: 2 + 2 + 2 + 2 + 2 = 10 bytes.
- ``fp8-exp-avg``: as ``bf16-moments`` with the first moment in FP8 (E4M3 with a per-tensor scale; the second moment
  stays bf16, whose range FP8 cannot hold): 9 bytes.

In a mode other than ``plain`` TE's FP8 weight cache is not kept across micro-batches (memory is why the mode was
chosen; each micro-batch casts its weights again, a few percent of an FP8 step at 7B).

``auto`` keeps ``plain`` wherever the run fits (every run that fits today is unchanged) and otherwise takes the first
mode, in the order above, that fits and whose loss check is committed (fp8lab.plan.evidence): a mode whose loss was
not measured inside the seeds' band is used only when asked for by name.
"""
from __future__ import annotations

from dataclasses import dataclass

from fp8lab.core.validate import AUTO

PLAIN = "plain"


@dataclass(frozen=True)
class Mode:
    name: str
    state_bytes: int  # per trainable parameter, on the GPU, between steps
    exp_avg: str  # dtype of AdamW's first moment ("fp32", "bf16", "fp8")
    exp_avg_sq: str  # and of the second
    summary: str  # one line for the run's log and --help

    @property
    def fused_adam(self) -> bool:
        """Stepped by Transformer Engine's FusedAdam (fp8lab.train.fused_states), not fp8lab's master weights."""
        return self.name != PLAIN


# the order auto tries them in: least lossy first
MODES = (
    Mode(PLAIN, 16, "fp32", "fp32", "bf16 weights and gradients, fp32 masters and AdamW moments (16 bytes/parameter)"),
    Mode("fp32-moments", 14, "fp32", "fp32", "TE FusedAdam: exact fp32 masters as bf16 weights + 16-bit remainders, "
         "fp32 moments (14 bytes/parameter)"),
    Mode("bf16-moments", 10, "bf16", "bf16", "TE FusedAdam: exact fp32 masters as bf16 weights + 16-bit remainders, "
         "bf16 moments (10 bytes/parameter)"),
    Mode("fp8-exp-avg", 9, "fp8", "bf16", "TE FusedAdam: exact fp32 masters as bf16 weights + 16-bit remainders, "
         "first moment in FP8, second in bf16 (9 bytes/parameter)"),
)
BY_NAME = {m.name: m for m in MODES}
NAMES = tuple(BY_NAME)
CHOICES = (AUTO, *NAMES)


def get(name: str) -> Mode:
    return BY_NAME[name]


def candidates(requested: str, *, gpu: bool, sharded: bool, param_dtype: str, backend: str | None,
               checked: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """(the modes the layout may try, in order; why only plain) for ``--memory requested``.

    ``checked``: the modes whose loss check is committed (fp8lab.plan.evidence). ValueError for a named mode that
    cannot run here, naming what can."""
    why_plain = (None if gpu and backend == "te" and param_dtype == "bf16" and not sharded else
                 "needs a CUDA GPU with Transformer Engine (its FusedAdam)" if not (gpu and backend == "te") else
                 "needs bf16 parameters (--param-dtype bf16 or auto)" if param_dtype != "bf16" else
                 "FSDP2 shards the states over GPUs instead")
    if requested == AUTO:
        if why_plain:
            return (PLAIN,), why_plain
        return (PLAIN, *(n for n in NAMES[1:] if n in checked)), None
    if requested != PLAIN and why_plain:
        raise ValueError(f"--memory {requested} {why_plain}; allowed here: auto | {PLAIN}")
    return (requested,), None
