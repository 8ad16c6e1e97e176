"""Memory modes: how many bytes of model state each trainable parameter keeps on the GPU, and the rule that picks one.

A run with bf16 parameters keeps, per parameter, the bf16 weight and its bf16 gradient (2 + 2 bytes), an fp32 master
copy (4) and AdamW's two moments (4 + 4): 16 bytes, so a 7B model's states alone take about 100 GiB and no H100 80 GB
can train it, in BF16 or FP8. FP8 does not shrink these states: it changes the GEMMs' inputs, not what the optimizer
keeps. The modes below keep less on the GPU: ``offload`` moves the plain states to host memory, the others keep fewer
bytes with Transformer Engine's ``FusedAdam`` (the library's kernels, not fp8lab's):

- ``plain``: fp8lab's own bf16 parameters + fp32 masters + fp32 AdamW (fp8lab.train.master_weights), 16 bytes.
- ``offload``: ``plain``'s states and arithmetic, with the fp32 masters and AdamW moments (12 bytes) in pinned host
  memory: the step brings them to the GPU a chunk at a time, runs the same AdamW kernel there and takes them back,
  so the GPU keeps 4 bytes (the bf16 weight and gradient). Nothing is rounded differently; each step moves 24 bytes
  per parameter over PCIe, which the run's speed pays for.
- ``fp32-moments``: FusedAdam keeps the fp32 master exactly, as the bf16 weight plus its 16 low bits
  (``store_param_remainders``), and both moments in fp32: 2 + 2 + 2 + 4 + 4 = 14 bytes. It differs from ``plain``
  only in the optimizer's implementation and the bf16 gradient: its loss check tells that apart from the moments'
  precision in the modes below.
- ``bf16-moments``: as ``fp32-moments`` with both moments in bf16: 2 + 2 + 2 + 2 + 2 = 10 bytes.
- ``fp8-exp-avg``: as ``bf16-moments`` with the first moment in FP8 (E4M3 with a per-tensor scale; the second moment
  stays bf16, whose range FP8 cannot hold): 9 bytes.

In the FusedAdam modes TE's FP8 weight cache is not kept across micro-batches (memory is why the mode was chosen;
each micro-batch casts its weights again, a few percent of an FP8 step at 7B).

``auto`` keeps ``plain`` wherever the run fits (every run that fits today is unchanged) and otherwise takes the first
mode, in the order above, that fits and whose loss check is committed (fp8lab.plan.evidence): a mode whose loss was
not measured inside the seeds' band is used only when asked for by name. ``offload`` is chosen by ``auto`` only where
the machine's host memory is known to hold its states.
"""
from __future__ import annotations

from dataclasses import dataclass

from fp8lab.core.validate import AUTO

PLAIN = "plain"
OFFLOAD = "offload"


@dataclass(frozen=True)
class Mode:
    name: str
    state_bytes: int  # per trainable parameter, on the GPU, between steps
    exp_avg: str  # dtype of AdamW's first moment ("fp32", "bf16", "fp8")
    exp_avg_sq: str  # and of the second
    summary: str  # one line for the run's log and --help
    host_bytes: int = 0  # per trainable parameter, in the host's pinned memory

    @property
    def fused_adam(self) -> bool:
        """Stepped by Transformer Engine's FusedAdam (fp8lab.train.fused_states), not fp8lab's master weights."""
        return self.name not in (PLAIN, OFFLOAD)

    @property
    def offloaded(self) -> bool:
        """fp8lab's master weights with their states in host memory (fp8lab.train.master_weights)."""
        return self.host_bytes > 0

    @property
    def kind(self) -> str:
        """Where the states live and what steps them: the modes of one kind run at about one speed."""
        return "fused-adam" if self.fused_adam else OFFLOAD if self.offloaded else PLAIN


# the order auto tries them in: least lossy first
MODES = (
    Mode(PLAIN, 16, "fp32", "fp32", "bf16 weights and gradients, fp32 masters and AdamW moments (16 bytes/parameter)"),
    Mode(OFFLOAD, 4, "fp32", "fp32", "plain's states and arithmetic; fp32 masters and AdamW moments in pinned host "
         "memory, stepped on the GPU a chunk at a time (4 bytes/parameter on the GPU, 12 in host memory)",
         host_bytes=12),
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


def of_record(value: object) -> str:
    """A run record's mode: records from before the modes (no value) trained in plain."""
    return value if isinstance(value, str) and value else PLAIN


def candidates(requested: str, *, gpu: bool, sharded: bool, param_dtype: str, backend: str | None,
               checked: tuple[str, ...]) -> tuple[tuple[str, ...], str | None]:
    """(the modes the layout may try, in order; why only plain) for ``--memory requested``.

    ``checked``: the modes whose loss check is committed (fp8lab.plan.evidence). ValueError for a named mode that
    cannot run here, naming what can."""
    why_not = {n: why for n in NAMES[1:] if (why := problem(n, gpu=gpu, sharded=sharded, param_dtype=param_dtype,
                                                            backend=backend))}
    if requested == AUTO:
        if len(why_not) == len(NAMES) - 1:  # no mode but plain runs here
            return (PLAIN,), next(iter(why_not.values()))
        return (PLAIN, *(n for n in NAMES[1:] if n in checked and n not in why_not)), None
    if requested in why_not:
        allowed = " | ".join((AUTO, PLAIN, *(n for n in NAMES[1:] if n not in why_not)))
        raise ValueError(f"--memory {requested} {why_not[requested]}; allowed here: {allowed}")
    return (requested,), None


def problem(name: str, *, gpu: bool, sharded: bool, param_dtype: str, backend: str | None) -> str | None:
    """Why mode ``name`` cannot run on this machine and layout (None: it can)."""
    mode = get(name)
    if mode.name == PLAIN:
        return None
    if mode.fused_adam and not (gpu and backend == "te"):
        return "needs a CUDA GPU with Transformer Engine (its FusedAdam)"
    if not gpu:
        return "needs a CUDA GPU (on a CPU the states are in host memory already)"
    if param_dtype != "bf16":
        return "needs bf16 parameters (--param-dtype bf16 or auto)"
    if sharded:
        return "FSDP2 shards the states over GPUs instead"
    return None
