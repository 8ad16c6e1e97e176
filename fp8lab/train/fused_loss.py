"""Fused linear cross-entropy (``--fused-loss``): the LM head and the loss without the full logits.

The plain loss multiplies the last hidden states by the head (``tokens x vocab`` logits), casts them
to fp32 and takes the cross-entropy; autograd keeps the logits, their fp32 copy and the gradient of
each. At a 128K vocabulary and 16 x 2048 tokens that is 16.8 GB per fp32 copy. Here the tokens are
taken a chunk at a time: the chunk's logits (the head GEMM in the compute dtype, then fp32), their
log-sum-exp, the loss, and at once the gradient of the chunk's logits (softmax minus the one-hot
target, over the mean's count), which gives the chunk's gradient of the hidden states and its share of
the head's weight gradient. Nothing of the size ``tokens x vocab`` outlives a chunk; the backward only
scales the two stored gradients by the incoming one. The GEMMs are the same three as the plain path's
(head forward, grad of the hidden states, grad of the weight), so no compute is added.

:class:`LinearCrossEntropy` is the autograd function; :func:`install` makes a model's LM head (a bias-free
``nn.Linear``, tied to the embedding or not) compute the loss in the model's own forward while
:func:`targets` is set, so DDP and FSDP2 see the head used as before and state dicts are unchanged.
:func:`decide` is ``--fused-loss auto|on|off``, the plan's decision (fp8lab.plan.runplan), and
:func:`loss_bytes` the memory the layout resolver (fp8lab.plan.layout) counts for it.

The chunk's loss and gradient run in one of three kernels (fp8lab.plan.fused_loss.KERNELS, :func:`kernel_for`):
on CUDA fp8lab.train.ce_kernel's Triton kernel, which writes the gradient over the logits (checked against the
eager math once per process and at the head's vocabulary when installed; where it cannot run, the torch.compile'd
math), on a CPU the eager math; a study picks another for a run (FP8LAB_FUSED_LOSS_KERNEL, the machine's
``loss_kernel`` in its plan). The chunk size is the
plan's (fp8lab.plan.fused_loss.chunk_tokens, by kernel).

Numerics: the logits of a chunk are the same GEMM as the plain path's (bf16 operands, fp32 accumulation,
under autocast), read as fp32 for the log-sum-exp, as ``F.cross_entropy(logits.float())`` does. With ``fp8``
(``--fp8-lm-head``) the three GEMMs run in FP8 instead: fp8lab.train.fp8_head. The
weight gradient is summed over chunks in fp32. ``tests/unit/test_fused_loss.py`` checks it against the
plain path in fp32 on the CPU; ``benchmarks/fused_loss_bench.py`` in BF16 on the GPU.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from fp8lab.train import ce_kernel, fp8_head  # (import neither torch nor triton at load)
# the rule (vocabulary, auto, chunk size, memory) lives in the plan; re-exported here for the mechanism's readers
from fp8lab.plan.fused_loss import (AUTO_MIN_LOGITS, BYTES_PER_LOGIT, CHOICES, CHUNK_BYTES, IGNORE_INDEX,  # noqa: F401
                                    KERNEL_ENV, KERNELS, MIN_CHUNK_TOKENS, WEIGHT_GRAD_BYTES, chunk_tokens, decide,
                                    loss_bytes, no_grad_chunk_tokens)
from fp8lab.plan.fused_loss import default_kernel


# ------------------------------------------------------------------------------------------ the function

def _compute_dtype(h, weight):
    import torch

    dev = h.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return torch.promote_types(h.dtype, weight.dtype)


def _add_weight_grad(acc, g_t, hc) -> None:
    """acc (fp32) += g_t @ hc, with an fp32 result where the device's GEMM offers one (CUDA: ``out_dtype``)."""
    import torch

    if g_t.dtype == torch.float32:
        acc.addmm_(g_t, hc)
        return
    try:
        acc.add_(torch.mm(g_t, hc, out_dtype=torch.float32))
    except (RuntimeError, TypeError, NotImplementedError):  # no fp32-output GEMM for this dtype/device
        acc.add_(g_t @ hc)


def _chunk_math_eager(logits, t, v, scale):
    """(sum of the chunk's losses in fp32, d(mean loss)/d(logits) in the logits' dtype): in place on one fp32 copy."""
    import torch

    lf = logits.float()  # the plain path's logits.float() for these tokens
    safe = torch.where(v, t, torch.zeros_like(t))
    lse = torch.logsumexp(lf, dim=-1)
    picked = lf.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(v, lse - picked, torch.zeros_like(lse)).sum()
    # (softmax - onehot) / count, zero for ignored tokens
    lf.sub_(lse[:, None]).exp_()
    rows = torch.arange(lf.shape[0], device=lf.device)
    lf[rows, safe] -= v.to(lf.dtype)
    lf.mul_((v.to(torch.float32) * scale)[:, None])
    return loss, lf.to(logits.dtype)


def _chunk_math(logits, t, v, scale):
    """The same as :func:`_chunk_math_eager`, written without in-place ops for torch.compile: one kernel reads the
    chunk's logits and writes their gradient (no fp32 copy of the chunk in memory)."""
    import torch

    lf = logits.float()
    safe = torch.where(v, t, torch.zeros_like(t))
    lse = torch.logsumexp(lf, dim=-1)
    picked = lf.gather(1, safe[:, None]).squeeze(1)
    loss = torch.where(v, lse - picked, torch.zeros_like(lse)).sum()
    onehot = (torch.arange(lf.shape[1], device=lf.device)[None, :] == safe[:, None]).to(torch.float32)
    g = (torch.exp(lf - lse[:, None]) - onehot) * (v.to(torch.float32) * scale)[:, None]
    return loss, g.to(logits.dtype)


_COMPILED: dict = {}  # device type -> the compiled chunk math, or None where compiling failed (eager from then on)
COMPILE_ON = ("cuda",)  # devices whose chunk math is compiled (Inductor's Triton kernels); CPUs run it eagerly
_TRITON_OK: dict = {}  # device type -> the Triton kernel passed its check against the eager math there (or not)


def _kernel_agrees(device_type: str, vocab: int = 5003, dtype=None, config: int | None = 0) -> str | None:
    """None where fp8lab.train.ce_kernel (CONFIGS[config]; None: the autotuned choice for this vocabulary) gives the
    eager math's loss and gradient on six rows here; else why not."""
    import torch

    try:
        gen = torch.Generator(device="cpu").manual_seed(0)
        x = (torch.randn(6, vocab, generator=gen) * 4).to(device=device_type, dtype=dtype or torch.float32)
        t = torch.randint(0, vocab, (6,), generator=gen).to(device_type)
        v = torch.tensor([True, True, False, True, True, True], device=device_type)
        scale = torch.tensor(0.2, device=device_type)
        want_loss, want_g = _chunk_math_eager(x.clone(), t, v, scale)
        got_loss, got_g = ce_kernel.chunk_math(x.clone(), t, v, scale, config=config)
        tol = 1e-6 if x.dtype == torch.float32 else 2e-3  # bf16: one rounding step of values up to 0.2
        if (abs(float(got_loss) - float(want_loss)) <= 1e-5 * abs(float(want_loss))
                and float((got_g.float() - want_g.float()).abs().max()) <= tol):
            return None
        return "its result differs from the eager math"
    except Exception as exc:  # noqa: BLE001 - a Triton or driver problem must not stop training
        return f"{type(exc).__name__}: {str(exc)[:200]}"


def _not_used(device_type: str, why: str) -> None:
    import warnings

    _TRITON_OK[device_type] = False
    warnings.warn(f"fp8lab.train.fused_loss: the Triton chunk kernel is not used ({why}); the next kernel "
                  "down runs instead (the compiled math on CUDA), in its own (smaller) chunks")


def _triton_checked(device_type: str) -> bool:
    """fp8lab.train.ce_kernel runs here and agrees with the eager math on a small case, in one fixed config (once
    per device type: no autotuning yet); a failure warns and the next kernel down runs instead (:func:`kernel_for`).
    The config autotuning picks for the head's vocabulary is checked when the head is installed (:func:`install`)."""
    if device_type not in _TRITON_OK:
        _TRITON_OK[device_type] = ce_kernel.available(device_type)
        why = _kernel_agrees(device_type) if _TRITON_OK[device_type] else None
        if why:
            _not_used(device_type, why)
    return _TRITON_OK[device_type]


_DOWN = {"triton": "compiled", "compiled": "eager"}  # the next kernel down, where one cannot run or fails


def _usable(device_type: str, kernel: str) -> bool:
    if kernel == "triton":
        return _triton_checked(device_type)
    if kernel == "compiled":
        return device_type in COMPILE_ON and _COMPILED.get(device_type, True) is not None
    return True


def kernel_for(device_type: str, planned: str | None = None) -> str:
    """The chunk kernel this process runs on ``device_type`` (fp8lab.plan.fused_loss.KERNELS): the ``planned`` one
    (the run plan's ``fused_loss_kernel``; None: fp8lab.plan.fused_loss.default_kernel: the Triton kernel on CUDA,
    eager on a CPU), or the next one down where
    that cannot run here: the Triton kernel where it is missing or failed its check, the compiled math where
    compiling failed or off CUDA."""
    kernel = planned or default_kernel(device_type == "cuda")
    while not _usable(device_type, kernel):
        kernel = _DOWN[kernel]
    return kernel


class _ChunkMathFailed(Exception):
    """A chunk kernel raised in the middle of a forward (its message: why); the forward runs again one kernel down."""


def _fall_back(device_type: str, kernel: str, why: str) -> str:
    """After ``kernel`` failed mid-run: it is not used again in this process (only it: a failed Triton kernel leaves
    the compiled math in use where that runs); the kernel to run the loss again with, one down from it."""
    import warnings

    if kernel == "triton":
        _TRITON_OK[device_type] = False
    elif kernel == "compiled":
        _COMPILED[device_type] = None
    down = _DOWN[kernel]
    while not _usable(device_type, down):
        down = _DOWN[down]
    how = "eagerly" if down == "eager" else f"with the {down} chunk math"
    warnings.warn(f"fp8lab.train.fused_loss: the {kernel} chunk math failed ({why}); running it {how} from now on, "
                  "in that kernel's chunks")
    return down


def _math_for(device_type: str, kernel: str):
    if kernel == "triton":
        return ce_kernel.chunk_math
    if kernel == "eager":
        return _chunk_math_eager
    if device_type not in _COMPILED:
        import torch

        _COMPILED[device_type] = torch.compile(_chunk_math, dynamic=False)
    return _COMPILED[device_type] or _chunk_math_eager


def _linear_ce_forward(h2, weight, tgt, dtype, need_grad: bool, chunk: int, ignore_index: int, kernel: str,
                       fp8: bool = False, need_w: bool = True):
    """(mean loss as fp32, grad of h2 or None, grad of weight or None), chunk by chunk (see the module doc); ``fp8``:
    the head's GEMMs in FP8 (fp8lab.train.fp8_head), in each chunk whose token count they can take; ``need_w`` False:
    no weight gradient (a frozen head, as under LoRA: one GEMM of three saved)."""
    import torch

    n = h2.shape[0]
    w = weight.to(dtype)
    valid = tgt != ignore_index
    count = valid.sum()
    scale = 1.0 / count.clamp(min=1).to(torch.float32)
    gemms = None  # the weight in FP8, made for the first chunk that runs in FP8
    g_mult = fp8_head.grad_multiplier(count) if fp8 else None
    loss = torch.zeros((), device=h2.device, dtype=torch.float32)
    grad_h = torch.empty((n, h2.shape[1]), device=h2.device, dtype=dtype) if need_grad else None
    one_chunk = n <= chunk
    need_w = need_grad and need_w
    grad_w = None if not need_w or one_chunk else torch.zeros(weight.shape, device=h2.device, dtype=torch.float32)
    math = _math_for(h2.device.type, kernel)
    for s in range(0, n, chunk):
        e = min(s + chunk, n)
        hc = h2[s:e].to(dtype)
        in_fp8 = fp8 and fp8_head.aligned(e - s)  # (else this chunk's GEMMs in the compute dtype)
        if in_fp8:
            gemms = gemms or fp8_head.HeadGemms(w, need_grad)
            h8, h_inv = gemms.input(hc)
            logits = gemms.logits(h8, h_inv, dtype)
        else:
            logits = hc @ w.t()  # (c, V) in the compute dtype: the plain path's head GEMM for these tokens
        t, v = tgt[s:e], valid[s:e]
        if not need_grad:  # (chunks cut by no_grad_chunk_tokens: the fp32 copy fits a training chunk's memory)
            lf = logits.float()
            del logits
            safe = torch.where(v, t, torch.zeros_like(t))
            picked = lf.gather(1, safe[:, None]).squeeze(1)
            loss += torch.where(v, torch.logsumexp(lf, dim=-1) - picked, torch.zeros_like(picked)).sum()
            del lf
            continue
        failed = None
        try:  # (in FP8, the gradient comes times g_mult: E5M2's range; fp8lab.train.fp8_head)
            if in_fp8 and math is ce_kernel.chunk_math:  # the kernel writes E5M2 itself: no cast pass over the chunk
                part, g = math(logits, t, v, scale * g_mult,
                               out=torch.empty(logits.shape, device=logits.device, dtype=torch.float8_e5m2))
            else:
                part, g = math(logits, t, v, scale * g_mult if in_fp8 else scale)
        except Exception as exc:  # noqa: BLE001 - a compiler or kernel problem must not stop training (the caller
            if kernel == "eager":  # runs the whole loss again, one kernel down: fp8lab.train.fused_loss._fall_back)
                raise
            failed = f"{type(exc).__name__}: {str(exc)[:200]}"
        if failed:  # raised outside the handler: no reference cycle keeps this pass's buffers alive
            raise _ChunkMathFailed(failed)
        loss += part
        del logits  # (the Triton kernel wrote g over it, or into the E5M2 buffer: then g holds the chunk's buffer)
        if in_fp8:
            g8 = g.to(torch.float8_e5m2)  # (no copy where the kernel wrote E5M2)
            del g
            g_inv = g_mult.reciprocal()
            grad_h[s:e] = gemms.grad_input(g8, g_inv, dtype)
            if need_w:
                part_w = gemms.grad_weight(g8, h8, g_inv, h_inv, dtype if one_chunk else torch.float32)
                if one_chunk:
                    grad_w = part_w
                else:
                    grad_w.add_(part_w)
                del part_w
            del g8
            continue
        grad_h[s:e] = g @ w
        if need_w and one_chunk:
            grad_w = g.t() @ hc
        elif need_w:
            _add_weight_grad(grad_w, g.t(), hc)
        del g  # before the next chunk's logits: one chunk's buffer at a time
    return loss * scale, grad_h, grad_w


class LinearCrossEntropy:
    """``apply(h, weight, targets, chunk, ignore_index)``: mean cross-entropy of ``h @ weight.T`` against
    ``targets`` (ignored: ``ignore_index``), in chunks of ``chunk`` tokens; ``h`` is (..., hidden), ``targets``
    its leading shape. An ``autograd.Function`` (built on first use: no torch import at module load)."""

    _fn = None

    @classmethod
    def apply(cls, h, weight, targets, chunk: int | None = None, ignore_index: int = IGNORE_INDEX,
              kernel: str | None = None, fp8: bool = False):
        if cls._fn is None:
            cls._fn = _make_function()
        import torch

        dtype = _compute_dtype(h, weight)
        need = torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad)
        h2, tgt = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        if tgt.shape[0] != h2.shape[0]:
            raise ValueError(f"fused loss: {tgt.shape[0]} targets for {h2.shape[0]} hidden states")
        if kernel is None:
            kernel = kernel_for(h2.device.type)
        elif kernel not in KERNELS:
            raise ValueError(f"fused loss: kernel={kernel!r} is invalid; allowed: " + " | ".join(KERNELS))
        fp8 = bool(fp8) and fp8_head.aligned(*weight.shape)  # (a head the FP8 GEMMs cannot take runs in dtype)
        return cls._fn.apply(h2, weight, tgt, dtype, need, int(chunk or 0), int(ignore_index), kernel, fp8)


def _make_function():
    import torch

    class _LinearCrossEntropyFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, h2, weight, tgt, dtype, need_grad, chunk, ignore_index, kernel, fp8):
            with torch.autocast(h2.device.type, enabled=False):
                while True:  # chunk 0: the kernel's own size (chosen again where a kernel fails and the next runs)
                    size = chunk or (chunk_tokens if need_grad else no_grad_chunk_tokens)(weight.shape[0], h2.shape[0],
                                                                                          kernel, fp8)
                    try:
                        loss, grad_h, grad_w = _linear_ce_forward(h2, weight, tgt, dtype, need_grad, size,
                                                                  ignore_index, kernel, fp8, ctx.needs_input_grad[1])
                        break
                    except _ChunkMathFailed as failed:  # (leaving this block frees the failed pass's buffers)
                        why = str(failed)
                    kernel = _fall_back(h2.device.type, kernel, why)
            ctx.grads = (grad_h, grad_w)
            ctx.dtypes = (h2.dtype, weight.dtype)
            return loss

        @staticmethod
        def backward(ctx, grad_out):
            grad_h, grad_w = ctx.grads
            ctx.grads = None
            if grad_h is None:
                raise RuntimeError("fused loss: backward of a forward run without gradients (torch.no_grad)")
            # times the incoming gradient (the trainer's 1/accumulation: a power of two, exact in bf16); no sync
            gh = grad_h.to(ctx.dtypes[0]).mul_(grad_out.to(ctx.dtypes[0]))
            gw = None if grad_w is None else grad_w.to(ctx.dtypes[1]).mul_(grad_out.to(ctx.dtypes[1]))
            return gh, gw, None, None, None, None, None, None, None

    return _LinearCrossEntropyFn


def linear_cross_entropy(h, weight, targets, chunk: int | None = None, ignore_index: int = IGNORE_INDEX,
                         compiled: bool | None = None, kernel: str | None = None, fp8: bool = False):
    """Mean cross-entropy of ``h @ weight.T`` against ``targets`` without the full logits (see the module doc).
    ``kernel``: the per-chunk loss and gradient (fp8lab.plan.fused_loss.KERNELS; None: :func:`kernel_for` the
    device: the Triton kernel on CUDA, eager on a CPU). ``compiled`` (older spelling): True = "compiled",
    False = "eager". ``chunk``: tokens per chunk (None: fp8lab.plan.fused_loss.chunk_tokens for the kernel).
    ``fp8``: the head's GEMMs in FP8 (fp8lab.train.fp8_head; ``--fp8-lm-head``)."""
    if kernel is None and compiled is not None:
        kernel = "compiled" if compiled else "eager"
    return LinearCrossEntropy.apply(h, weight, targets, chunk, ignore_index, kernel, fp8)


# ------------------------------------------------------------------------------------------ the model's head

_TARGETS = "_fp8lab_fused_targets"
_KERNEL = "_fp8lab_fused_kernel"  # the plan's chunk kernel, set by install
_FP8 = "_fp8lab_fused_fp8"  # the head's GEMMs in FP8 (the plan's fp8_lm_head), set by install


def head_of(model) -> Any:
    """The model's LM head (``lm_head``: HF causal LMs and fp8lab's fused models), or None."""
    return getattr(model, "lm_head", None)


def head_problem(head) -> str | None:
    """Why this head cannot compute the fused loss (None: it can): it must be a bias-free ``nn.Linear``."""
    import torch.nn as nn

    if not isinstance(head, nn.Linear):
        return f"the LM head is a {type(head).__name__}, not a torch.nn.Linear"
    if head.bias is not None:
        return "the LM head has a bias"
    return None


def install(model, autocast_dtype=None, kernel: str | None = None, fp8: bool = False) -> None:
    """Make ``model``'s LM head return the fused loss while :func:`targets` is set (plain logits otherwise).

    The head keeps its parameters, its name in the state dict and its tie to the embedding; only its
    class becomes :class:`FusedLossHead` (an ``nn.Linear``). ValueError where the head cannot (head_problem).
    ``autocast_dtype``: the dtype the trainer's autocast runs the head in (None: no autocast, the weight's own), for
    which the Triton kernel is tuned here, before the first step. ``kernel``: the plan's chunk kernel (the run plan's
    ``fused_loss_kernel``; None: :func:`kernel_for`'s rule), which the head runs, or the next one down (kernel_for).
    ``fp8``: its GEMMs in FP8 (the plan's ``fp8_lm_head``: fp8lab.train.fp8_head)."""
    head = head_of(model)
    problem = "the model has no lm_head" if head is None else head_problem(head)
    if problem:
        raise ValueError(f"--fused-loss: {problem}; allowed: --fused-loss off")
    head.__class__ = _head_class()
    head.__dict__[_KERNEL] = kernel
    head.__dict__[_FP8] = bool(fp8)
    w = head.weight
    if w.device.type != "meta" and kernel_for(w.device.type, kernel) == "triton":  # tune the kernel now, memory free
        dtype = autocast_dtype or w.dtype
        ce_kernel.warm_up(w.shape[0], dtype, w.device, out_dtype="float8_e5m2" if fp8 else None)
        why = _kernel_agrees(w.device.type, w.shape[0], dtype, config=None)  # the config it picked, checked
        if why:
            _not_used(w.device.type, why)


def installed(model) -> bool:
    head = head_of(model)
    return head is not None and type(head).__name__ == "FusedLossHead"


@contextmanager
def targets(model, y) -> Iterator[None]:
    """While open, ``model``'s installed head returns the mean loss against ``y`` instead of the logits
    (``y`` None: nothing changes)."""
    head = head_of(model) if y is not None else None
    if head is None:
        yield
        return
    head.__dict__[_TARGETS] = y
    try:
        yield
    finally:
        head.__dict__.pop(_TARGETS, None)


_HEAD_CLASS = None


def _head_class():
    global _HEAD_CLASS
    if _HEAD_CLASS is None:
        import torch.nn as nn

        class FusedLossHead(nn.Linear):
            """An LM head that, while fp8lab.train.fused_loss.targets is set, returns the mean loss (a scalar) in
            place of the logits; a plain ``nn.Linear`` otherwise."""

            def forward(self, x):
                y = self.__dict__.get(_TARGETS)
                if y is None:
                    return super().forward(x)
                return linear_cross_entropy(x, self.weight, y,
                                            kernel=kernel_for(x.device.type, self.__dict__.get(_KERNEL)),
                                            fp8=self.__dict__.get(_FP8, False))

        FusedLossHead.__module__, FusedLossHead.__qualname__ = __name__, "FusedLossHead"  # picklable by name
        _HEAD_CLASS = FusedLossHead
    return _HEAD_CLASS


def __getattr__(name: str):  # fp8lab.train.fused_loss.FusedLossHead, built on first use (no torch import at load)
    if name == "FusedLossHead":
        return _head_class()
    raise AttributeError(name)
