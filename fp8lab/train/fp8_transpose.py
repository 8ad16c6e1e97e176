"""The transposed copy of a 2-d FP8 tensor (``x.t().contiguous()``) as one tiled Triton kernel.

cuBLAS's FP8 GEMMs take the contracted dimension contiguous in both operands, so the FP8 LM head
(fp8lab.train.fp8_head) transposes, per chunk, its E5M2 gradient (tokens x vocabulary, one byte each) and its E4M3
hidden states for the weight gradient, and its E4M3 weight once per loss.

PyTorch's copy took 30 ms for a 32,768 x 128,256 gradient on one H100, where the same kernel, a tile at a time,
took 3 ms (benchmarks/logs/session32/micro-h100.jsonl, ``benchmarks/fp8_head_micro.py``): most of what the head's
three FP8 GEMMs save. Elsewhere (no Triton, a CPU), or where the kernel fails, the copy is PyTorch's.
"""
from __future__ import annotations

import functools

from fp8lab.train import ce_kernel  # (imports neither torch nor triton at load)

TILE = (64, 256)  # rows x columns of the input per program: the fastest of those timed (64x64, 128x128, 64x256)
# (the grid's second dimension, columns / 256, stays far below CUDA's 65,535 for any vocabulary or hidden size)
FAILED: dict = {}  # device type -> why the kernel failed there (PyTorch's copy from then on)


@functools.lru_cache(maxsize=None)
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def transpose_tiles(x_ptr, y_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr):
        rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
        cols = tl.program_id(1).to(tl.int64) * BN + tl.arange(0, BN)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        tile = tl.load(x_ptr + rows[:, None] * N + cols[None, :], mask=mask)
        tl.store(y_ptr + cols[None, :] * M + rows[:, None], tile, mask=mask)

    return transpose_tiles


def transpose(x):
    """``x.t().contiguous()`` for a 2-d tensor of one-byte elements (FP8), by the Triton kernel where it runs
    (fp8lab.train.ce_kernel.available: CUDA, or Triton's interpreter), else by PyTorch."""
    import torch

    where = x.device.type
    if x.dim() != 2 or x.element_size() != 1 or where in FAILED or not ce_kernel.available(where):
        return x.t().contiguous()
    x = x.contiguous()
    m, n = x.shape
    y = torch.empty((n, m), device=x.device, dtype=x.dtype)
    if not x.numel():
        return y
    bm, bn = TILE
    try:
        # (as bytes: Triton's FP8 types are not every torch FP8 dtype, and a copy needs no arithmetic)
        _kernel()[(-(-m // bm), -(-n // bn))](x.view(torch.uint8), y.view(torch.uint8), m, n, BM=bm, BN=bn)
    except Exception as exc:  # noqa: BLE001 - a Triton or driver problem must not stop training: the slower copy
        import warnings

        FAILED[where] = f"{type(exc).__name__}: {str(exc)[:200]}"
        warnings.warn(f"fp8lab.train.fp8_transpose: the Triton transpose failed ({FAILED[where]}); PyTorch's copy "
                      "runs from now on (the same result, slower)")
        return x.t().contiguous()
    return y
