"""FP8 attention: whether a run computes its dot-product attention in FP8, and why.

Transformer Engine's FP8 dot-product attention (``fp8_dpa=True`` on the TE recipe) casts Q, K and V
to FP8 inside ``te.DotProductAttention`` and runs cuDNN's FP8 fused-attention kernel; the
projections around it stay as they are (``fp8_mha`` stays off). It applies to fp8lab's fused TE
blocks only (``--fuse True``: ``fp8lab.fp8.backends.te.TEParts.attention`` is a ``te.DotProductAttention``);
the swapped layers (``--fuse False``) keep HF's attention, which TE does not touch.

What TE 2.20 can run (``transformer_engine/common/fused_attn/fused_attn.cpp``,
``nvte_get_fused_attn_backend``, and ``pytorch/attention/dot_product_attention/utils.py``):

* Hopper (sm90), training: head_dim 128 for Q/K and V exactly ("hidden_dim should be equal to 128"
  at head_dim 64), causal or no mask (no sliding windows: GPT-Neo's local layers, Mistral's
  windows), and the **delayed** recipe only (TE disables FP8 current-scaling attention below sm100);
* Blackwell (sm100): head_dim up to 128 (a multiple of 16); delayed, current or MXFP8 recipes;
* Ada and older GPUs: no FP8 fused attention; block scaling: never.

``--fp8-attention auto`` turns it on only where it was measured to pay: a Hopper GPU, the conditions
above, and a sequence of at least the measured crossover (:func:`crossover_seq_len`, from the evidence). ``on``
refuses, before anything is built, where it cannot run; ``off`` never uses it.

TE's ``NVTE_FP8_DPA_BWD`` (default 1) chooses the backward: 1 = FP8 attention forward and backward,
0 = FP8 forward, BF16 backward. fp8lab sets 1 explicitly (:data:`FP8_DPA_BWD`, where the environment does not
set it) so a run records what ran. The study compared both: 0 became unstable where 1 trained like FP8 with BF16
attention (benchmarks/studies/long_context.md).
"""
from __future__ import annotations

from typing import Any

from fp8lab.core import hardware
from fp8lab.core.validate import AUTO
from fp8lab.plan.evidence import FP8_ATTENTION_STUDY, Evidence
from fp8lab.fp8.recipe import kinds_where
from fp8lab.model.models import layer_windows

CHOICES = (AUTO, "on", "off")

# ``auto`` turns it on from the sequence length where it was measured to pay: the evidence's crossover
# (fp8lab.plan.evidence, from data/results/long-context-h200/crossover.json; the study:
# benchmarks/studies/long_context.md), this value where none is committed. ``auto`` also waits for the loss check
# (the same short run with and without FP8 attention at two seeds): faster attention is no default until its loss
# is shown to hold.
CROSSOVER_SEQ_LEN = 8192

BWD_ENV = "NVTE_FP8_DPA_BWD"
FP8_DPA_BWD = "1"  # TE's own default: FP8 backward too; 0 (BF16 backward) diverged in the study's loss check

MEASURED = ("hopper",)  # where the crossover was measured: auto turns FP8 attention on only there


def recipes(gen: str | None) -> tuple[str, ...]:
    """The recipe kinds TE runs FP8 attention with on GPU generation ``gen`` (their rows' ``fp8_attention``)."""
    return kinds_where(lambda row: gen in row.fp8_attention)


def generation(gpu_name: str) -> str | None:
    """'hopper' | 'blackwell' | None: the GPU's generation where some recipe runs TE's FP8 fused attention on it
    (None: a GPU without it, or not known here)."""
    gen = hardware.generation(gpu_name)
    return gen if recipes(gen) else None


def problem(*, precision: str, backend: str | None, fuse: bool, recipe_kind: str | None, mcfg, gpu: bool,
            gpu_name: str) -> str | None:
    """Why FP8 attention cannot run for this set-up (None: it can), naming what is allowed."""
    if precision != "fp8":
        return "it needs --precision fp8 (a bf16 run has no FP8 region)"
    if backend != "te":
        return f"it needs --backend te (TE's FP8 dot-product attention); the run's backend is {backend or 'none'}"
    if not fuse:
        return ("it needs --fuse True: only fp8lab's fused blocks run te.DotProductAttention (the swapped layers keep "
                "HF's attention)")
    gen = generation(gpu_name) if gpu else None
    if gen is None:
        return (f"{gpu_name if gpu else 'a CPU'} has no FP8 fused attention in TE (cuDNN's FP8 attention needs "
                f"Hopper H100/H200 or Blackwell B200)")
    allowed = recipes(gen)
    if recipe_kind not in allowed:
        return f"--recipe {recipe_kind}: TE's FP8 attention on {gen.title()} needs recipe {' | '.join(allowed)}"
    hd = mcfg.head_dim
    if (gen == "hopper" and hd != 128) or (gen == "blackwell" and (hd > 128 or hd % 16)):
        need = "exactly 128" if gen == "hopper" else "at most 128, a multiple of 16"
        return f"head_dim {hd}: TE's FP8 attention on {gen.title()} needs head_dim {need}"
    if any(layer_windows(mcfg)):
        return "the model has sliding-window (local) attention layers; TE's FP8 attention supports causal masks only"
    return None


def decide(choice: str, *, seq_len: int, evidence: Evidence = Evidence(), **setup: Any) -> tuple[bool, str]:
    """(FP8 attention on, why) for ``--fp8-attention choice``; ValueError for ``on`` where it cannot run.

    ``evidence``: the committed study's crossover and loss check; ``setup``: the keywords of :func:`problem`
    (precision, backend, fuse, recipe_kind, mcfg, gpu, gpu_name)."""
    if choice == "off":
        return False, "--fp8-attention off"
    why_not = problem(**setup)
    if choice == "on":
        if why_not:
            raise ValueError(f"--fp8-attention on cannot run: {why_not}; allowed: auto | off, or change that setting")
        return True, "--fp8-attention on"
    if why_not:
        return False, f"auto: off, {why_not}"
    gen = generation(setup["gpu_name"])
    if gen not in MEASURED:
        return False, (f"auto: off, FP8 attention's speed-up is not measured on {gen.title()} "
                       "(pass --fp8-attention on to try it)")
    crossover = crossover_seq_len(evidence)
    source = _source(evidence)
    if seq_len < crossover:
        return False, f"auto: off at sequence {seq_len}: FP8 attention pays from {crossover} tokens on ({source})"
    loss = evidence.fp8_attention_loss
    if loss is not True:
        return False, (f"auto: off at sequence {seq_len}: FP8 attention pays from {crossover} tokens on "
                       f"({source}), but " + ("its loss check is not committed yet" if loss is None else
                                              "its committed loss check is outside the bound "
                                              "(max(0.5%, the seed noise))")
                       + " (pass --fp8-attention on to use it)")
    return True, f"auto: on at sequence {seq_len} >= {crossover}, head_dim 128 ({source}; loss checked)"


def crossover_seq_len(evidence: Evidence) -> int:
    """The sequence length from which ``auto`` turns FP8 attention on: the measured one, else the provisional."""
    return evidence.fp8_attention_crossover or CROSSOVER_SEQ_LEN


def _source(evidence: Evidence) -> str:
    return ("measured: " + FP8_ATTENTION_STUDY if evidence.fp8_attention_crossover is not None
            else "provisional: TE layer stacks on an H200")
