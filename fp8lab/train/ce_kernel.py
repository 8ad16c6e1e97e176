"""The chunked loss's per-chunk math as one Triton kernel, in place: ``--fused-loss``'s kernel on CUDA
(fp8lab.plan.fused_loss.kernel_for; ``FP8LAB_FUSED_LOSS_KERNEL=compiled`` runs the torch.compile'd math instead).

For each row of a chunk's logits (one token), the kernel reads the row once for its running maximum and
sum of exponentials (the log-sum-exp, in fp32), takes the row's loss (log-sum-exp minus the target's
logit), and reads the row a second time to write, over the logits themselves, their gradient: (softmax
minus the one-hot target) times the mean's scale, zero for ignored targets. Two reads and one write of the
chunk and no buffer of its own, for what :func:`fp8lab.train.fused_loss._chunk_math_eager` computes, in the logits'
dtype (or into a second buffer the caller gives, e.g. the FP8 head's E5M2 one); one read where a row fits in one
block. Its block size, warps and grid are autotuned per vocabulary size
(CONFIGS) the first time a process runs it; Triton keeps the timings in its cache, so later processes skip them.

Its speed against the compiled math, in whole training steps: benchmarks/studies/fused_loss.md
(data/results/fused-loss-kernel-h200). :func:`chunk_math` is the entry;
:func:`available` says whether this process can run it (Triton imports and the device is CUDA).
``TRITON_INTERPRET=1`` runs the same kernel on a CPU (how the tests check it there).
"""
from __future__ import annotations

import functools

# Each config: (logits per step of a row's loop, warps per program, how pass 1 keeps its running maximum and sum:
# 0 = one per row, reduced over each block, 1 = one per lane, reduced once at the row's end, at two exps per logit;
# programs per SM: 0 = one program per row, k = k * the SM count of programs, each taking every (programs)-th row,
# so that fewer rows are in flight and the second pass may find its row still in L2). Where a row fits in one
# block (llama-1b's 32,000 in 32,768), the kernel reads it once, keeps it in registers and writes the gradient from
# them: one read instead of two. Triton times each once per vocabulary size and keeps the fastest (triton.autotune;
# the logits are restored between its trials, since the kernel writes over them). Each config's measured time:
# benchmarks/studies/fused_loss.md.
CONFIGS = ((4096, 8, 0, 0), (8192, 8, 0, 0), (8192, 16, 0, 0), (16384, 16, 0, 0), (16384, 32, 0, 0),
           (32768, 16, 0, 0), (32768, 32, 0, 0), (4096, 8, 1, 0), (8192, 16, 1, 0),
           (8192, 16, 0, 2), (16384, 32, 0, 1), (32768, 32, 0, 1))
BLOCK = CONFIGS[0][0]  # the smallest: the tests' rows span several of them
INTERPRET_CONFIG = 0  # the config Triton's interpreter runs (it cannot time them); the tests go through each


@functools.lru_cache(maxsize=None)
def _jit():
    """The kernel, its SINGLE meta-parameter derived from the others (a row within one block)."""
    import triton
    import triton.language as tl

    @triton.jit
    def ce_grad_in_place(x_ptr, g_ptr, t_ptr, loss_ptr, scale_ptr, n_rows, n_cols, stride, g_stride, ignore_index,
                         BLOCK: tl.constexpr, LANES: tl.constexpr, PER_SM: tl.constexpr, SINGLE: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        scale = tl.load(scale_ptr)
        first, step = tl.program_id(0).to(tl.int64), tl.num_programs(0).to(tl.int64)  # (64-bit row offsets)
        for row in range(first, n_rows, step):  # one row, or every (programs)-th
            base = x_ptr + row * stride
            g_base = g_ptr + row * g_stride  # (x_ptr itself unless the caller gave another buffer)
            t = tl.load(t_ptr + row)
            valid = t != ignore_index
            tsafe = tl.where(valid, t, 0)
            coef = tl.where(valid, scale, 0.0)
            if SINGLE:  # the whole row in one block: read once, the gradient from the registers
                mask = cols < n_cols
                x = tl.load(base + cols, mask=mask, other=-float("inf")).to(tl.float32)
                m = tl.max(x, axis=0)
                e = tl.exp(x - m)
                s = tl.sum(e, axis=0)
                picked = tl.load(base + tsafe).to(tl.float32)
                tl.store(loss_ptr + row, tl.where(valid, m + tl.log(s) - picked, 0.0))
                g = (e * (1.0 / s) - tl.where(cols == tsafe, 1.0, 0.0)) * coef
                tl.store(g_base + cols, g.to(g_ptr.dtype.element_ty), mask=mask)
            else:
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
                picked = tl.load(base + tsafe).to(tl.float32)
                tl.store(loss_ptr + row, tl.where(valid, lse - picked, 0.0))
                # pass 2: the gradient of the mean loss, over the logits
                for off in range(0, n_cols, BLOCK):
                    idx = off + cols
                    mask = idx < n_cols
                    x = tl.load(base + idx, mask=mask, other=0.0).to(tl.float32)
                    g = (tl.exp(x - lse) - tl.where(idx == tsafe, 1.0, 0.0)) * coef
                    tl.store(g_base + idx, g.to(g_ptr.dtype.element_ty), mask=mask)

    return triton.heuristics({"SINGLE": lambda a: a["n_cols"] <= a["BLOCK"]})(ce_grad_in_place)


@functools.lru_cache(maxsize=None)
def _autotuned():
    """The kernel autotuned over CONFIGS, once per vocabulary size (the timings kept on disk: Triton's cache)."""
    import triton

    configs = [triton.Config({"BLOCK": b, "LANES": lanes, "PER_SM": per_sm}, num_warps=w)
               for b, w, lanes, per_sm in CONFIGS]
    # (Triton adds the tensors' dtypes to the key: a one-byte gradient is tuned apart from a bf16 one)
    return triton.autotune(configs=configs, key=["n_cols"], restore_value=["x_ptr"], cache_results=True)(_jit())


def _grid(n_rows: int, sms: int):
    """The launch grid for a config's meta-parameters: a program per row, or PER_SM programs per SM (at most a row
    each)."""
    return lambda meta: (n_rows if not meta["PER_SM"] else max(1, min(n_rows, sms * meta["PER_SM"])),)


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


def chunk_math(logits, t, v, scale, config: int | None = None, out=None):
    """(sum of the chunk's losses in fp32, d(mean loss)/d(logits) written over ``logits``, or into ``out``: a
    contiguous tensor of the logits' shape, in any dtype the kernel can store, e.g. E5M2 for the FP8 head, which then
    needs no separate cast of the gradient); ``t`` the targets,
    ``v`` which of them count (``t`` is read as ignored where ``v`` is False), ``scale`` 1 / the mean's count (a
    0-d fp32 tensor on the same device). ``logits`` must be a contiguous (tokens, vocabulary) tensor. ``config``:
    run CONFIGS[config] (the tests check each); None: the autotuned choice (Triton's interpreter, which cannot time
    them: CONFIGS[INTERPRET_CONFIG])."""
    import torch

    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"ce_kernel.chunk_math: logits must be 2-d with contiguous rows, got {tuple(logits.shape)} "
                         f"strides {logits.stride()}")
    n, vocab = logits.shape
    out = logits if out is None else out
    if out.shape != logits.shape or out.stride(1) != 1:
        raise ValueError(f"ce_kernel.chunk_math: out must have the logits' shape {tuple(logits.shape)} and contiguous "
                         f"rows, got {tuple(out.shape)} strides {out.stride()}")
    ignore = -1  # v folded into the targets: -1 is never a token
    tt = torch.where(v, t, torch.full_like(t, ignore)).to(torch.int64).contiguous()
    rows = torch.empty(n, device=logits.device, dtype=torch.float32)
    sc = scale.to(device=logits.device, dtype=torch.float32).reshape(1).contiguous()
    if n:
        grid = _grid(n, _sm_count(logits.device))
        args = (logits, out, tt, rows, sc, n, vocab, logits.stride(0), out.stride(0), ignore)
        if config is None and not _interpreted():
            _autotuned()[grid](*args)
        else:
            b, w, lanes, per_sm = CONFIGS[INTERPRET_CONFIG if config is None else config]
            meta = {"BLOCK": b, "LANES": lanes, "PER_SM": per_sm}
            _jit()[grid(meta)](*args, **meta, num_warps=w)
    return rows.sum(), out


def _sm_count(device) -> int:
    """Streaming multiprocessors of ``device`` (CUDA); 2 elsewhere (the interpreter's CPU tests: several rows a
    program)."""
    import torch

    if device.type != "cuda":
        return 2
    return torch.cuda.get_device_properties(device).multi_processor_count


def warm_up(vocab: int, dtype, device, rows: int = 8192, out_dtype=None) -> None:
    """Run the kernel once on ``rows`` random rows of this vocabulary, so that its autotuning (which times every
    config, restoring a copy of the logits between trials) happens now, while memory is free, not inside the first
    training step at the activations' peak. The rows fill the GPU many times over, as a micro-batch does.
    ``out_dtype`` (a torch dtype's name): also tune the kernel that writes the gradient into a buffer of that dtype
    (the FP8 head's "float8_e5m2"), which Triton tunes apart."""
    import torch

    x = torch.randn(rows, vocab, device=device, dtype=dtype)
    t = torch.randint(0, vocab, (rows,), device=device)
    v, scale = torch.ones(rows, dtype=torch.bool, device=device), torch.tensor(1.0 / rows, device=device)
    if out_dtype is not None:
        chunk_math(x, t, v, scale, out=torch.empty(x.shape, device=device, dtype=getattr(torch, out_dtype)))
    chunk_math(x, t, v, scale)
    del x, t

