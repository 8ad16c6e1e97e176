"""The LM head's GEMMs in FP8 inside the chunked loss (fp8lab.train.fp8_head, ``--fp8-lm-head``), on this CPU's
``torch._scaled_mm``: the same numbers as the math on the dequantized operands, close to the unquantized loss, chunks
that add up, a chunk or head the FP8 GEMMs cannot take run in the compute dtype, and a training run that uses it
(the GPU's cuBLAS GEMMs: tests/gpu/test_fp8_head_chunks_gpu.py)."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from fp8lab.train import fp8_head
from fp8lab.train.entry import TrainConfig, train
from fp8lab.train.fused_loss import linear_cross_entropy


@pytest.fixture(autouse=True)
def strict_scaled_mm(monkeypatch):
    """This CPU's ``torch._scaled_mm`` takes layouts and shapes cuBLAS's FP8 GEMMs refuse on a GPU: each call here is
    held to the GPU's rules (first operand row-major, second column-major, the contracted dimension and the second
    operand's both dimensions multiples of 16, fp32 scales of one element) before it runs."""
    real = torch._scaled_mm

    def strict(a, b, scale_a=None, scale_b=None, **kw):
        assert a.stride(1) == 1 and b.stride(0) == 1, (a.shape, a.stride(), b.shape, b.stride())
        assert a.shape[1] % 16 == 0 and b.shape[0] % 16 == 0 and b.shape[1] % 16 == 0, (a.shape, b.shape)
        assert {a.dtype, b.dtype} <= {torch.float8_e4m3fn, torch.float8_e5m2} and not (
            a.dtype == b.dtype == torch.float8_e5m2)
        for sc in (scale_a, scale_b):
            assert sc.dtype == torch.float32 and sc.numel() == 1
        return real(a, b, scale_a=scale_a, scale_b=scale_b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", strict)


def _case(n=96, vocab=512, hidden=64, seed=0, peaky=4.0):
    """Hidden states, a head and targets whose logits are far from uniform (as after some training)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g) * (peaky / hidden ** 0.5)
    t = torch.randint(0, vocab, (n,), generator=g)
    t[5] = -100
    return h, w, t


def _grads(h, w, t, **kw):
    h, w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    loss = linear_cross_entropy(h, w, t, kernel="eager", **kw)
    loss.backward()
    return loss.detach(), h.grad, w.grad


def test_quantize_scales_by_a_power_of_two_into_e4m3s_range():
    x = torch.randn(64, 32) * 37.0
    x8, inv = fp8_head.quantize(x)
    assert x8.dtype == torch.float8_e4m3fn and inv.dtype == torch.float32 and inv.dim() == 0
    scale = 1 / float(inv)
    assert scale == 2.0 ** round(torch.log2(torch.tensor(scale)).item())  # a power of two
    assert float(x8.float().abs().max()) <= fp8_head.E4M3_MAX
    assert float(x.abs().max()) * scale > fp8_head.E4M3_MAX / 2  # the range is used (within a factor of two)
    err = (x8.float() * inv - x).norm() / x.norm()
    assert 0 < float(err) < 0.05
    z8, _ = fp8_head.quantize(torch.zeros(16, 16))  # an all-zero tensor: zeros, no NaN
    assert torch.equal(z8.float(), torch.zeros(16, 16))
    # bf16 input: the scaling is exact there (no fp32 copy), the same E4M3 values
    b8, binv = fp8_head.quantize(x.bfloat16())
    ref = (x.bfloat16().float() / float(binv)).to(torch.float8_e4m3fn)
    assert torch.equal(b8.float(), ref.float())


@pytest.mark.parametrize("count", [1, 7, 1000, 32_768, 131_072])
def test_the_gradient_multiplier_maps_one_over_count_just_under_grad_top(count):
    m = float(fp8_head.grad_multiplier(torch.tensor(count)))
    assert m == 2.0 ** round(torch.log2(torch.tensor(m)).item())
    assert fp8_head.GRAD_TOP / 2 < m / count <= fp8_head.GRAD_TOP


def test_the_fp8_chunks_compute_the_math_of_the_dequantized_operands():
    """Forward and both gradients against the same math written out in fp32 on the E4M3/E5M2 values: the layouts,
    the scales and the gradient's multiplier are right, to fp32 rounding."""
    h, w, t = _case()
    loss, gh, gw = _grads(h, w, t, fp8=True)
    h8, h_inv = fp8_head.quantize(h)
    w8, w_inv = fp8_head.quantize(w)
    hd, wd = h8.float() * h_inv, w8.float() * w_inv
    logits = hd @ wd.t()
    valid = t != -100
    ref_loss = F.cross_entropy(logits, t)
    count = valid.sum()
    m = fp8_head.grad_multiplier(count)
    g = (torch.softmax(logits, -1) - F.one_hot(t.clamp(min=0), logits.shape[1]).float()) * valid[:, None] / count
    gd = (g * m).to(torch.float8_e5m2).float() / m
    assert abs(float(loss) - float(ref_loss)) < 1e-5 * float(ref_loss)
    assert torch.allclose(gh, gd @ wd, rtol=1e-5, atol=1e-7)
    assert torch.allclose(gw, gd.t() @ hd, rtol=1e-5, atol=1e-7)


def test_the_fp8_chunks_stay_close_to_the_unquantized_loss_and_gradients():
    h, w, t = _case()
    l8, gh8, gw8 = _grads(h, w, t, fp8=True)
    l, gh, gw = _grads(h, w, t)
    assert abs(float(l8 - l)) / float(l) < 0.01
    for a, b in ((gh8, gh), (gw8, gw)):
        cos = F.cosine_similarity(a.flatten(), b.flatten(), dim=0)
        assert float(cos) > 0.99, float(cos)
        assert 0 < float((a - b).norm() / b.norm()) < 0.15


def test_chunks_add_up_and_a_chunk_the_gemms_cannot_take_runs_in_the_compute_dtype(monkeypatch):
    h, w, t = _case(n=104)  # chunks of 32: three of 32 tokens in FP8, the last of 8 in the compute dtype
    calls = []
    real = torch._scaled_mm

    def counted(*a, **kw):
        calls.append(a[0].shape)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    l4, gh4, gw4 = _grads(h, w, t, fp8=True, chunk=32)
    assert len(calls) == 3 * 3  # forward, input gradient, weight gradient of each aligned chunk
    assert torch.isfinite(gh4).all() and torch.isfinite(gw4).all()
    lp, ghp, gwp = _grads(h, w, t, chunk=32)  # the plain path
    assert abs(float(l4 - lp)) / float(lp) < 0.01
    assert float(F.cosine_similarity(gw4.flatten(), gwp.flatten(), dim=0)) > 0.99  # fp32 sum of FP8 and plain parts
    # the last chunk's rows ran unquantized: exactly the plain path's gradient for those rows (same count)
    assert torch.allclose(gh4[96:], ghp[96:], rtol=1e-6, atol=1e-9)
    assert float((gh4[:96] - ghp[:96]).norm()) > 0  # the aligned chunks did not
    # a head whose shape the GEMMs cannot take (vocabulary 211) runs wholly in the compute dtype
    calls.clear()
    h2, w2, t2 = _case(vocab=211)
    l8, g8, _ = _grads(h2, w2, t2, fp8=True)
    lp2, gp2, _ = _grads(h2, w2, t2)
    assert not calls and torch.equal(l8, lp2) and torch.equal(g8, gp2)


def test_without_gradients_the_loss_is_the_fp8_forwards():
    h, w, t = _case()
    with torch.no_grad():
        l8 = linear_cross_entropy(h, w, t, kernel="eager", fp8=True)
    assert abs(float(l8) - float(_grads(h, w, t, fp8=True)[0])) < 1e-6


@pytest.mark.parametrize("vocab", [32_000, 128_256, 151_936])
def test_the_plans_chunks_at_real_sizes_are_ones_the_fp8_gemms_take(vocab):
    """Validation's chunks are cut smaller than training's; in FP8 they stay multiples of 16 tokens, so the
    evaluation runs the same FP8 head as the steps (not the BF16 fallback)."""
    from fp8lab.plan import fused_loss as rule

    for tokens in (2048, 8192, 32_768):
        for kernel in rule.KERNELS:
            assert rule.chunk_tokens(vocab, tokens, kernel, fp8=True) % 16 == 0
            assert rule.no_grad_chunk_tokens(vocab, tokens, kernel, fp8=True) % 16 == 0


def test_hidden_states_in_any_layout_reach_the_gemms_row_major():
    """A column-major (transposed) input is copied row-major by the quantization: the strict fixture would fail."""
    h, w, t = _case()
    hcol = h.t().contiguous().t()
    assert hcol.stride(1) != 1
    l8, gh8, _ = _grads(hcol, w, t, fp8=True)
    l, gh, _ = _grads(h, w, t, fp8=True)
    assert torch.equal(l8, l) and torch.equal(gh8, gh)


def test_a_training_run_with_the_fused_loss_runs_its_head_in_fp8(prepared, tmp_path, monkeypatch):
    """``--fp8-lm-head True --fused-loss on`` on the emulated backend: the plan says so, the head's GEMMs run as
    scaled FP8 GEMMs (counted), and the loss follows the same run with the head in the compute dtype."""
    calls = []
    real = torch._scaled_mm

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    base = dict(model="llama-tiny", precision="fp8", backend="emulated", fused_loss="on", steps=4, data=str(prepared),
                progress="off", print_metrics=False, plot=False, checkpoint_every=-1, save_model=False)
    runs = {}
    for head in (True, False):
        out = tmp_path / f"head-{head}"
        s = train(TrainConfig(fp8_lm_head=head, output_dir=str(out), **base))
        assert s["status"] == "completed" and s["nonfinite_steps"] == 0
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["fp8_lm_head"] is head and cfg["fused_loss"] == "on"
        runs[head] = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()
                      if '"loss"' in line and '"step"' in line]
        if head:
            assert len(calls) >= 3 * 4 and "in each chunk of the fused loss" in cfg["plan"]["reasons"]["fp8_lm_head"]
            calls.clear()
    assert not calls  # the BF16 head ran no scaled GEMM
    assert len(runs[True]) == len(runs[False]) >= 4
    assert max(abs(a - b) / b for a, b in zip(runs[True], runs[False])) < 0.02
    # auto on a CPU: no FP8 GEMMs there, the head stays in the compute dtype
    out = tmp_path / "auto"
    train(TrainConfig(output_dir=str(out), **{**base, "steps": 1}))
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["fp8_lm_head"] is False and "without FP8 GEMMs" in cfg["plan"]["reasons"]["fp8_lm_head"]


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_a_frozen_head_gets_no_weight_gradient_and_skips_its_gemm(fp8, monkeypatch):
    """Under LoRA the head is frozen: the chunked loss computes the hidden states' gradient only (the same values)."""
    h, w, t = _case()
    _, gh_full, _ = _grads(h, w, t, fp8=fp8)
    from fp8lab.train import fused_loss

    calls, returned = [], []
    real, forward = torch._scaled_mm, fused_loss._linear_ce_forward

    def counted(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    def spied(*a, **kw):
        returned.append(forward(*a, **kw))
        return returned[-1]

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    monkeypatch.setattr(fused_loss, "_linear_ce_forward", spied)
    hh = h.clone().requires_grad_(True)
    linear_cross_entropy(hh, w, t, kernel="eager", fp8=fp8).backward()  # w: no requires_grad
    assert torch.equal(hh.grad, gh_full) and w.grad is None
    assert len(returned) == 1 and returned[0][2] is None  # no weight gradient computed at all
    assert len(calls) == (2 if fp8 else 0)  # in FP8: forward and input gradient, no weight-gradient GEMM


def test_a_transpose_kernel_that_fails_falls_back_to_pytorchs_copy(monkeypatch):
    """Where the Triton transpose raises (a compiler or driver problem), a warning says why and PyTorch's copy runs,
    then and from then on: training goes on with the same result."""
    from fp8lab.train import ce_kernel, fp8_transpose

    calls = []

    def broken():
        calls.append(1)
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(ce_kernel, "available", lambda device_type: True)
    monkeypatch.setattr(fp8_transpose, "_kernel", broken)
    monkeypatch.setattr(fp8_transpose, "FAILED", {})
    x = (torch.randn(20, 48) * 8).to(torch.float8_e4m3fn)
    with pytest.warns(UserWarning, match=r"the Triton transpose failed \(RuntimeError: no compiler here\)"):
        y = fp8_transpose.transpose(x)
    assert torch.equal(y.view(torch.uint8), x.t().contiguous().view(torch.uint8)) and y.is_contiguous()
    assert torch.equal(fp8_transpose.transpose(x).view(torch.uint8), y.view(torch.uint8)) and calls == [1]
