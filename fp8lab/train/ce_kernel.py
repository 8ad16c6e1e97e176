"""The chunked loss's per-chunk math as one Triton kernel, in place: a study's kernel for ``--fused-loss``
(``FP8LAB_FUSED_LOSS_KERNEL=triton``; the default is the torch.compile'd math, fp8lab.plan.fused_loss.kernel_for).

For each row of a chunk's logits (one token), the kernel reads the row once for its running maximum and
sum of exponentials (the log-sum-exp, in fp32), takes the row's loss (log-sum-exp minus the target's
logit), and reads the row a second time to write, over the logits themselves, their gradient: (softmax
minus the one-hot target) times the mean's scale, zero for ignored targets. Two reads and one write of the
chunk and no second buffer, for what :func:`fp8lab.train.fused_loss._chunk_math_eager` computes, in the logits'
dtype. Its block size and warps are autotuned per vocabulary size (CONFIGS) the first time a process runs it.

Measured so far (benchmarks/studies/fused_loss.md, session 22): whole training steps with its first version (one
fixed block size) in benchmarks/logs/session22/triton-v1, +0.5-0.9% at 128K-152K vocabularies and -0.9% at 32K
against the compiled math; the autotuned version is not yet measured. :func:`chunk_math` is the entry;
:func:`available` says whether this process can run it (Triton imports and the device is CUDA).
``TRITON_INTERPRET=1`` runs the same kernel on a CPU (how the tests check it there).
"""
from __future__ import annotations

import functools

# (logits per step of a row's loop, warps per row, how pass 1 keeps its running maximum and sum: 0 = one per row,
# reduced over each block, 1 = one per lane, reduced once at the row's end, at two exps per logit). Triton times
# each once per vocabulary size and keeps the fastest (triton.autotune; the logits are restored between its
# trials, since the kernel writes over them). Session 22 measured only (4096, 8, 0), as the one fixed config.
CONFIGS = ((4096, 8, 0), (8192, 8, 0), (8192, 16, 0), (16384, 16, 0), (16384, 32, 0), (32768, 32, 0),
           (4096, 8, 1), (8192, 16, 1))
BLOCK = CONFIGS[0][0]  # the smallest: the tests' rows span several of them
INTERPRET_CONFIG = 0  # the config Triton's interpreter runs (it cannot time them); the tests go through each


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def ce_grad_in_place(x_ptr, t_ptr, loss_ptr, scale_ptr, n_cols, stride, ignore_index, BLOCK: tl.constexpr,
                         LANES: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = x_ptr + row * stride
        cols = tl.arange(0, BLOCK)
        # pass 1: the running maximum and sum of exp(x - maximum)
        if LANES:  # per lane, no reduction inside the loop (a finite start: -inf - -inf would be NaN)
            mv = tl.full([BLOCK], -3.0e38, tl.float32)
            sv = tl.zeros([BLOCK], tl.float32)
            for off in range(0, n_cols, BLOCK):
                x = tl.load(base + off + cols, mask=off + cols < n_cols, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(mv, x)
                sv = sv * tl.exp(mv - m_new) + tl.exp(x - m_new)
                mv = m_new
            m = tl.max(mv, axis=0)
            s = tl.sum(sv * tl.exp(mv - m), axis=0)
        else:  # per row, a block at a time (one exp per logit)
            m = tl.max(tl.full([BLOCK], -float("inf"), tl.float32), axis=0)
            s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
            for off in range(0, n_cols, BLOCK):
                x = tl.load(base + off + cols, mask=off + cols < n_cols, other=-float("inf")).to(tl.float32)
                m_new = tl.maximum(m, tl.max(x, axis=0))
                s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
                m = m_new
        lse = m + tl.log(s)
        t = tl.load(t_ptr + row)
        valid = t != ignore_index
        tsafe = tl.where(valid, t, 0)
        picked = tl.load(base + tsafe).to(tl.float32)
        tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
        coef = tl.where(valid, tl.load(scale_ptr), 0.0)
        # pass 2: the gradient of the mean loss, over the logits
        for off in range(0, n_cols, BLOCK):
            idx = off + cols
            mask = idx < n_cols
            x = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32)
            g = (tl.exp(x - lse) - tl.where(idx == tsafe, 1.0, 0.0)) * coef
            tl.store(base + idx, g.to(x_ptr.dtype.element_ty), mask=mask)

    if _interpreted():  # Triton's interpreter (a CPU's tests) cannot time configs: INTERPRET_CONFIG's
        return _one_config(ce_grad_in_place)
    return triton.autotune(configs=[triton.Config({"BLOCK": b, "LANES": lanes}, num_warps=w) for b, w, lanes in CONFIGS],
                           key=["n_cols"], restore_value=["x_ptr"])(ce_grad_in_place)


class _one_config:  # kernel[grid](...) with CONFIGS[INTERPRET_CONFIG], as the autotuned kernel is called
    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        b, w, lanes = CONFIGS[INTERPRET_CONFIG]
        return functools.partial(self.fn[grid], BLOCK=b, LANES=lanes, num_warps=w)


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def _importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - any import problem: not available
        return False
    return True


def available(device_type: str) -> bool:
    """Triton imports here and the device is CUDA (or TRITON_INTERPRET=1 is set, for a CPU's tests)."""
    if not _importable():
        return False
    return device_type == "cuda" or _interpreted()


def chunk_math(logits, t, v, scale):
    """(sum of the chunk's losses in fp32, d(mean loss)/d(logits) written over ``logits``); ``t`` the targets,
    ``v`` which of them count (``t`` is read as ignored where ``v`` is False), ``scale`` 1 / the mean's count (a
    0-d fp32 tensor on the same device). ``logits`` must be a contiguous (tokens, vocabulary) tensor."""
    import torch

    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"ce_kernel.chunk_math: logits must be 2-d with contiguous rows, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    n, vocab = logits.shape
    ignore = -1  # v folded into the targets: -1 is never a token
    tt = torch.where(v, t, torch.full_like(t, ignore)).to(torch.int64).contiguous()
    rows = torch.empty(n, device=logits.device, dtype=torch.float32)
    sc = scale.to(device=logits.device, dtype=torch.float32).reshape(1).contiguous()
    if n:
        _kernel()[(n,)](logits, tt, rows, sc, vocab, logits.stride(0), ignore)
    return rows.sum(), logits


def warm_up(vocab: int, dtype, device, rows: int = 8192) -> None:
    """Run the kernel once on ``rows`` random rows of this vocabulary, so that its autotuning (which times every
    config, restoring a copy of the logits between trials) happens now, while memory is free, not inside the first
    training step at the activations' peak. The rows fill the GPU many times over, as a micro-batch does."""
    import torch

    x = torch.randn(rows, vocab, device=device, dtype=dtype)
    t = torch.randint(0, vocab, (rows,), device=device)
    chunk_math(x, t, torch.ones(rows, dtype=torch.bool, device=device), torch.tensor(1.0 / rows, device=device))
    del x, t

