"""The fused linear cross-entropy's rule (``--fused-loss auto|on|off``): its vocabulary, when ``auto``
turns it on (:func:`decide`, read by the plan), which kernel runs its chunks (:func:`kernel_for`), how large they are
(:func:`chunk_tokens`) and the memory the layout resolver counts for it (:func:`loss_bytes`). The mechanism:
:mod:`fp8lab.train.fused_loss`."""
from __future__ import annotations

from fp8lab.core.hardware import LOSS_KERNEL_ENV, Machine
from fp8lab.core.validate import AUTO

CHOICES = (AUTO, "on", "off")
IGNORE_INDEX = -100  # targets equal to it add nothing to the loss or the mean's count (HF's convention)

# Tokens per chunk: the largest power of two (at least MIN_CHUNK_TOKENS, at most the micro-batch) whose
# memory, BYTES_PER_LOGIT of the kernel that runs it, stays within CHUNK_BYTES. The kernels
# (fp8lab.train.fused_loss): "triton", fp8lab.train.ce_kernel (the default on CUDA), writes the logits' gradient over
# the logits (its bf16 logits are all a chunk holds): the whole 32,768-token micro-batch at 32K-152K vocabularies;
# "compiled", the torch.compile'd chunk math (CUDA's next kernel down), and "eager" (CPUs) hold ~9 bytes per logit:
# 8,192 tokens at 128K-152K, the whole micro-batch at 32K. Their speed, alone and in whole training steps:
# benchmarks/studies/fused_loss.md.
CHUNK_BYTES = 16 * 2**30
MIN_CHUNK_TOKENS = 1024

# --fused-loss auto: on a GPU where vocabulary x tokens per micro-batch reaches this (the logits' elements): the
# smallest size where the chunked loss was measured faster than the plain one, llama-1b's 32,000 x 8,192
# (benchmarks/studies/fused_loss.md). Below it (e.g. llama-7b's 2 x 2048 micro-batch) the plain loss is kept.
AUTO_MIN_LOGITS = 32_000 * 8192
# what the layout resolver counts for the fused loss instead of the plain path's logits (fp8lab.plan.layout.LOGIT_BYTES
# per token and vocabulary entry): per logit of one chunk, by kernel, and per weight of the head. "triton": the
# chunk's bf16 logits (2 bytes), overwritten by their gradient, and the GEMMs' room. Each is fitted to the measured
# peaks of the study's runs with that kernel (data/results/fused-loss-h200, fused-loss-kernel-h200; how close the
# estimates came: benchmarks/studies/fused_loss.md).
BYTES_PER_LOGIT = {"triton": 2.6, "compiled": 9.0, "eager": 9.0}
KERNELS = tuple(BYTES_PER_LOGIT)
WEIGHT_GRAD_BYTES = 8.0  # per head weight: the fp32 gradient sum and one chunk's fp32 GEMM result
# Without gradients (validation) a chunk's loss is read from its logits in fp32, as the plain loss reads them: the
# bf16 logits, their fp32 copy and log-sum-exp's fp32 temporary. Its chunks are cut so that they hold no more than a
# training chunk of the same kernel: evaluation never needs more memory than the step the layout was sized for.
NO_GRAD_BYTES_PER_LOGIT = 10.0


# --fp8-lm-head in the chunks (fp8lab.train.fp8_head): the gradient's E5M2 copy beside each chunk's logits, and the
# head's weight in E4M3 twice (W and W.T) for the step.
FP8_HEAD_BYTES_PER_LOGIT = 1.0
FP8_HEAD_WEIGHT_BYTES = 2.0
FP8_HEAD_CHOICES = (AUTO, True, False)
FP8_HEAD_ALIGN = 16  # FP8 GEMMs need the contracted dimensions (tokens, hidden, vocabulary) in multiples of this


KERNEL_ENV = LOSS_KERNEL_ENV  # a study's choice of kernel (one of KERNELS: a control), as Machine.detect reads it


def default_kernel(gpu: bool) -> str:
    """The chunk kernel a device runs unless a study chose another: the Triton kernel (fp8lab.train.ce_kernel) on a
    GPU, measured faster than the compiled math at every vocabulary in whole steps
    (benchmarks/studies/fused_loss.md), eager on a CPU. Where Triton does not run, the compiled math runs instead
    (fp8lab.train.fused_loss.kernel_for), in its own chunks."""
    return "triton" if gpu else "eager"


def kernel_for(machine: Machine) -> str:
    """The chunk kernel ``machine`` runs: its ``loss_kernel`` (a study's control, e.g. ``compiled``), else
    :func:`default_kernel`; ValueError for a kernel not in KERNELS."""
    chosen = machine.loss_kernel
    if chosen:
        if chosen not in KERNELS:
            raise ValueError(f"{KERNEL_ENV}={chosen!r} is invalid; allowed: " + " | ".join(KERNELS))
        return chosen
    return default_kernel(machine.gpu)


def _bytes_per_logit(kernel: str, fp8: bool) -> float:
    return BYTES_PER_LOGIT[kernel] + (FP8_HEAD_BYTES_PER_LOGIT if fp8 else 0.0)


def chunk_tokens(vocab: int, n_tokens: int, kernel: str, fp8: bool = False) -> int:
    """Tokens per chunk for this vocabulary and kernel (``fp8``: the head's GEMMs in FP8): its memory within
    CHUNK_BYTES, at most all the tokens."""
    per_token = vocab * _bytes_per_logit(kernel, fp8)
    c = MIN_CHUNK_TOKENS
    while c * 2 * per_token <= CHUNK_BYTES:
        c *= 2
    return max(1, min(c, n_tokens))


def no_grad_chunk_tokens(vocab: int, n_tokens: int, kernel: str, fp8: bool = False) -> int:
    """Tokens per chunk of a loss without gradients: a training chunk's memory (:func:`chunk_tokens` of ``kernel``)
    read at NO_GRAD_BYTES_PER_LOGIT, at least one token; with ``fp8`` a multiple of FP8_HEAD_ALIGN tokens where it
    can be (the FP8 GEMMs run only such chunks)."""
    budget = _bytes_per_logit(kernel, fp8) * vocab * chunk_tokens(vocab, n_tokens, kernel, fp8)
    tokens = max(1, min(n_tokens, int(budget // (NO_GRAD_BYTES_PER_LOGIT * vocab))))
    if fp8 and tokens < n_tokens and tokens >= FP8_HEAD_ALIGN:
        tokens -= tokens % FP8_HEAD_ALIGN
    return tokens


def decide(choice: str, *, vocab: int, tokens_per_micro_batch: int, gpu: bool) -> tuple[bool, str]:
    """(the fused loss runs, why) for ``--fused-loss choice``. It is pure PyTorch: it runs on any device and
    backend (TE, torchao, the emulator, the plain model), in BF16 or with the head's GEMMs in FP8
    (:func:`fp8_head_decide`); ``auto`` follows the measured rule (AUTO_MIN_LOGITS) on a GPU and stays off on a CPU
    (its logits are small there)."""
    if choice not in CHOICES:
        raise ValueError(f"--fused-loss={choice!r} is invalid; allowed: " + " | ".join(CHOICES))
    logits = vocab * tokens_per_micro_batch
    size = f"vocabulary {vocab:,} x {tokens_per_micro_batch:,} tokens per micro-batch = {logits:.3g} logits"
    if choice == "on":
        return True, f"--fused-loss on: {size}, chunked (the full logits never exist)"
    if choice == "off":
        return False, "--fused-loss off: the plain loss over the full fp32 logits"
    if not gpu:
        return False, "auto: off on a CPU (its micro-batches' logits are small; --fused-loss on runs it there too)"
    if logits >= AUTO_MIN_LOGITS:
        return True, f"auto: {size} >= {AUTO_MIN_LOGITS:.3g}, where the chunked loss was measured faster"
    return False, f"auto: {size} < {AUTO_MIN_LOGITS:.3g} (the smallest size measured to pay): the plain loss"


def loss_bytes(*, vocab: int, hidden: int, tokens_per_micro_batch: int, kernel: str = "compiled",
               fp8_head: bool = False) -> float:
    """Bytes the fused loss holds at its peak (one chunk's logits and gradient, the fp32 weight-gradient sum; with
    ``fp8_head`` the gradient's E5M2 copy and the weight's two E4M3 copies)."""
    chunk = chunk_tokens(vocab, tokens_per_micro_batch, kernel, fp8_head)
    weight = WEIGHT_GRAD_BYTES + (FP8_HEAD_WEIGHT_BYTES if fp8_head else 0.0)
    return _bytes_per_logit(kernel, fp8_head) * vocab * chunk + weight * vocab * hidden


def no_grad_loss_bytes(*, vocab: int, tokens_per_micro_batch: int, kernel: str = "compiled",
                       fp8_head: bool = False) -> float:
    """Bytes the fused loss holds without gradients (validation): one no-grad chunk's logits read in fp32."""
    return NO_GRAD_BYTES_PER_LOGIT * vocab * no_grad_chunk_tokens(vocab, tokens_per_micro_batch, kernel, fp8_head)


def fp8_head_decide(choice, *, precision: str, fused: bool, fp8_gemms: bool, vocab: int, hidden: int,
                    gpu: bool = True) -> tuple[bool, str]:
    """(the LM head's GEMMs run in FP8, why) for ``--fp8-lm-head choice`` (auto | True | False). ``auto``: in an FP8
    run whose loss is chunked (``fused``) on a device with FP8 GEMMs (``fp8_gemms``), where the head's shape suits
    them (fp8lab.train.fp8_head.aligned); the plan applies it only once its GPU check passes
    (fp8lab.plan.evidence; benchmarks/studies/fp8_lm_head.md). True: also elsewhere in an FP8 run (without the
    chunked loss: the backend's FP8 layer over the full logits, a study's control); refused in the chunks on a GPU
    without FP8 GEMMs (a CPU runs them, slowly: tests) and for a head whose shape they cannot take. The head's
    numerics: E4M3 forward, E5M2 gradient, a scale per tensor taken from the tensor."""
    if choice not in FP8_HEAD_CHOICES:
        raise ValueError(f"--fp8-lm-head={choice!r} is invalid; allowed: auto | True | False")
    if choice is False:
        return False, "--fp8-lm-head False: the LM head in the compute dtype"
    if precision != "fp8":
        return False, f"a {precision} run: the LM head in the compute dtype"
    if choice is True and fused and (vocab % FP8_HEAD_ALIGN or hidden % FP8_HEAD_ALIGN):
        raise ValueError(f"--fp8-lm-head True: the LM head's vocabulary {vocab} x hidden {hidden} is not a multiple "
                         f"of {FP8_HEAD_ALIGN} each, which FP8 GEMMs need; allowed: --fp8-lm-head auto | False")
    if choice is True and fused and gpu and not fp8_gemms:
        raise ValueError("--fp8-lm-head True: this GPU has no FP8 GEMMs for the fused loss's chunks (torch._scaled_mm "
                         "needs compute capability 8.9 or 9.0+); allowed: --fp8-lm-head auto | False")
    if choice is True:
        how = "in each chunk of the fused loss" if fused else "over the full logits (the backend's FP8 layer)"
        return True, f"--fp8-lm-head True: the LM head's GEMMs in FP8 {how}"
    if not fused:
        return False, "auto: off without the fused loss (the head's GEMM over the full logits stays in BF16)"
    if not fp8_gemms:
        return False, "auto: off on a device without FP8 GEMMs (torch._scaled_mm)"
    if vocab % FP8_HEAD_ALIGN or hidden % FP8_HEAD_ALIGN:
        return False, f"auto: off: the head's vocabulary {vocab} x hidden {hidden} is not a multiple of 16 each"
    return True, "auto: the LM head's three GEMMs in FP8 in each chunk of the fused loss (E4M3/E5M2, scale per tensor)"
