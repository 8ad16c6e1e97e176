"""The LM head's three GEMMs in FP8 inside the chunked loss (``--fp8-lm-head``; fp8lab.train.fused_loss).

The chunked loss runs, per chunk of tokens, the head's forward (logits = h @ W.T), the gradient of the hidden states
(g @ W) and the head's weight gradient (g.T @ h), where g is the gradient of the chunk's logits. Here each is one
``torch._scaled_mm`` on FP8 operands, as the converted blocks' GEMMs are: h and W in E4M3, g in E5M2, each with one
scale per tensor (current scaling: taken from the tensor itself, no history), accumulated in fp32 and written in the
compute dtype (the weight gradient in fp32 where several chunks add up).

Scales are powers of two, so that multiplying a BF16 tensor by its scale before the cast is exact and costs no fp32
copy. The logits' gradient needs no measured scale at all: it is (softmax - one-hot target) / count, so its magnitude is
at most 1 / count. The chunk math is asked for the gradient times :func:`grad_multiplier` (a power of two that maps
1 / count to at most GRAD_TOP); probabilities down to about 2^-30 stay above E5M2's smallest subnormal.

FP8 GEMMs take the contracted dimension contiguous in both operands (row-major first, column-major second), and each
dimension of the second operand a multiple of 16 (:func:`aligned`). So the weight is held twice (W and W.T, one byte
each, for the step), and the chunk's gradient and hidden states are transposed once for the weight gradient
(fp8lab.train.fp8_transpose: a tiled kernel; PyTorch's copy of the gradient took ten times as long on an H100).
``torch._scaled_mm`` runs on CUDA GPUs with FP8 tensor cores and on CPUs (where the tests check it against the same
math on dequantized tensors). torch is imported inside the functions, as in fp8lab.train.fused_loss: importing this
module (the plan's rule reads it) loads no torch.
"""
from __future__ import annotations

from fp8lab.plan.fused_loss import FP8_HEAD_ALIGN as ALIGN  # the plan's rule (torch-free), declared there
from fp8lab.train import fp8_transpose  # (imports neither torch nor triton at load)

E4M3_MAX = 448.0
GRAD_TOP = 2.0 ** 15  # below E5M2's largest finite value, 57,344


def aligned(*dims: int) -> bool:
    """Every dimension a multiple of ALIGN (what ``torch._scaled_mm`` needs of the operands' inner dimensions)."""
    return all(int(d) % ALIGN == 0 for d in dims)


def _pow2_at_most(x):
    """The largest power of two <= x, elementwise, as fp32 (x > 0), kept within fp32's normal range."""
    import torch

    return torch.exp2(torch.floor(torch.log2(x)).clamp(-126.0, 126.0))


def quantize(x, fp8_dtype=None):
    """(x in E4M3 scaled by a power of two so that its largest magnitude is at most E4M3_MAX, the fp32 scale that
    undoes it). No host synchronisation: the scale stays on the device."""
    import torch

    fp8_dtype = fp8_dtype or torch.float8_e4m3fn
    lo, hi = torch.aminmax(x)
    amax = torch.maximum(hi.float().abs(), lo.float().abs()).clamp(min=1e-30)
    scale = _pow2_at_most(E4M3_MAX / amax)
    # row-major whatever x's strides: cuBLAS's FP8 GEMMs take no other layout for the first operand
    return (x * scale.to(x.dtype)).to(fp8_dtype).contiguous(), scale.reciprocal()


def grad_multiplier(count):
    """The power of two the chunk math multiplies the logits' gradient by (its scale becomes 1/count times this), so
    that every element of it is at most GRAD_TOP in magnitude; its reciprocal is the E5M2 operand's scale."""
    return _pow2_at_most(GRAD_TOP * count.clamp(min=1).float())


class HeadGemms:
    """The FP8 copy of the head's weight for one forward of the loss, and the three GEMMs of each chunk."""

    def __init__(self, weight, need_grad: bool):
        w8, self.w_inv = quantize(weight)
        self.w8 = w8  # (V, d): the forward's second operand, read as W.T column-major
        self.w8_t = fp8_transpose.transpose(w8) if need_grad else None  # (d, V): the input gradient's, as W col-major

    def input(self, hc):
        """The chunk's hidden states in E4M3 (h8, its scale's reciprocal)."""
        return quantize(hc)

    def logits(self, h8, h_inv, dtype):
        import torch

        # fast accumulation in the forward only, as TE's own FP8 GEMMs do it (their gradients' GEMMs promote partial
        # sums to fp32 more often, as the two below do by default)
        return torch._scaled_mm(h8, self.w8.t(), scale_a=h_inv, scale_b=self.w_inv, out_dtype=dtype,
                                use_fast_accum=True)

    def grad_input(self, g8, g_inv, dtype):
        """d(loss)/d(h) of the chunk: g (E5M2, tokens x V) @ W."""
        import torch

        return torch._scaled_mm(g8, self.w8_t.t(), scale_a=g_inv, scale_b=self.w_inv, out_dtype=dtype)

    @staticmethod
    def grad_weight(g8, h8, g_inv, h_inv, out_dtype):
        """The chunk's share of d(loss)/d(W): g.T @ h, both transposed so that the tokens are the contiguous
        (contracted) dimension."""
        import torch

        return torch._scaled_mm(fp8_transpose.transpose(g8), fp8_transpose.transpose(h8).t(), scale_a=g_inv,
                                scale_b=h_inv, out_dtype=out_dtype)
