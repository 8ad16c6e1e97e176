"""The transposed copy of a 2-d FP8 tensor (``x.t().contiguous()``) as one tiled Triton kernel.

cuBLAS's FP8 GEMMs take the contracted dimension contiguous in both operands, so the FP8 LM head
(fp8lab.train.fp8_head) transposes the chunk's E5M2 gradient (tokens x vocabulary, one byte each) for its weight
gradient, and its E4M3 weight once per loss. PyTorch's strided copy does that a byte at a time: measured 30 ms for
a 32,768 x 128,256 gradient on one H100, where this kernel, a tile at a time, takes 3 ms
(benchmarks/logs/session32/micro-h100.jsonl, ``benchmarks/fp8_head_micro.py``): the difference is most of what
the head's three FP8 GEMMs save. Elsewhere (no Triton, a CPU) the copy is PyTorch's.
"""
from __future__ import annotations

import functools

from fp8lab.train import ce_kernel  # (imports neither torch nor triton at load)

TILE = (64, 256)  # rows x columns of the input per program: the fastest of those timed (64x64, 128x128, 64x256)


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

    if x.dim() != 2 or x.element_size() != 1 or not ce_kernel.available(x.device.type):
        return x.t().contiguous()
    import triton

    x = x.contiguous()
    m, n = x.shape
    y = torch.empty((n, m), device=x.device, dtype=x.dtype)
    if x.numel():
        bm, bn = TILE
        # (as bytes: Triton's FP8 types are not every torch FP8 dtype, and a copy needs no arithmetic)
        _kernel()[(triton.cdiv(m, bm), triton.cdiv(n, bn))](x.view(torch.uint8), y.view(torch.uint8), m, n,
                                                             BM=bm, BN=bn)
    return y
