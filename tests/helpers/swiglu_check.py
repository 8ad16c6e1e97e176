"""One check shared by the CPU and GPU tests of fp8lab.fp8.fused.SwiGLU."""
from __future__ import annotations

import torch


def assert_swiglu_is_autograds(y: torch.Tensor) -> None:
    """SwiGLU of ``y`` ([gate, up] on the last dimension) gives autograd's ``silu(gate) * up`` bit for bit: the
    values, their dtype, and the gradient of ``y`` for a random upstream gradient."""
    from fp8lab.fp8.fused import SwiGLU

    mine, ref = y.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
    gate, up = ref.chunk(2, -1)
    h_mine, h_ref = SwiGLU.apply(mine), torch.nn.functional.silu(gate) * up
    dh = torch.randn_like(h_ref)
    h_mine.backward(dh)
    h_ref.backward(dh)
    assert h_mine.dtype == y.dtype and torch.equal(h_mine, h_ref)
    assert mine.grad.dtype == y.dtype and torch.equal(mine.grad, ref.grad)
