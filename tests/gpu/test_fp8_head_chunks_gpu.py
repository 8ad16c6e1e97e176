"""The LM head's GEMMs in FP8 inside the chunked loss on a Hopper GPU (cuBLAS's FP8 GEMMs through
``torch._scaled_mm``, the Triton chunk kernel; skipped without a TE-capable GPU): the same numbers as the math on the
dequantized operands, close to the BF16 chunked loss at a real vocabulary, and the trainer on TE's layers running it
in a chunked FP8 run and training alike (the CPU's: tests/unit/test_fp8_head_chunks.py)."""
from __future__ import annotations

import json

import pytest
from gpu_skips import te_or_skip

from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.gpu


def _case(n, vocab, hidden, seed=0):
    import torch

    g = torch.Generator("cuda").manual_seed(seed)
    h = torch.randn(n, hidden, device="cuda", generator=g).bfloat16()
    w = (torch.randn(vocab, hidden, device="cuda", generator=g) * (4.0 / hidden ** 0.5)).bfloat16()
    t = torch.randint(0, vocab, (n,), device="cuda", generator=g)
    return h, w, t


def _run(h, w, t, **kw):
    import torch

    from fp8lab.train.fused_loss import linear_cross_entropy

    h, w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    with torch.autocast("cuda", torch.bfloat16):
        loss = linear_cross_entropy(h, w, t, **kw)
    loss.backward()
    return loss.detach().float(), h.grad.float(), w.grad.float()


@pytest.mark.parametrize("vocab,chunk", [(32_000, None), (128_256, 1024)], ids=["32k-one-chunk", "128k-chunks"])
def test_fp8_chunks_on_the_gpu_match_their_math_and_follow_bf16(vocab, chunk, gpu_record):
    te_or_skip()
    import torch
    import torch.nn.functional as F

    from fp8lab.train import fp8_head

    h, w, t = _case(4096, vocab, 2048)
    l8, gh8, gw8 = _run(h, w, t, fp8=True, chunk=chunk)
    lb, ghb, gwb = _run(h, w, t, chunk=chunk)
    # the math on the dequantized operands, in fp32
    h8, h_inv = fp8_head.quantize(h)
    w8, w_inv = fp8_head.quantize(w)
    hd, wd = h8.float() * h_inv, w8.float() * w_inv
    logits = hd @ wd.t()
    ref = F.cross_entropy(logits, t)
    m = fp8_head.grad_multiplier(torch.tensor(t.numel(), device="cuda"))
    g = (torch.softmax(logits, -1) - F.one_hot(t, vocab).float()) / t.numel()
    gd = (g * m).to(torch.float8_e5m2).float() / m
    errs = {"loss_vs_math": abs(float(l8 - ref)) / float(ref), "loss_vs_bf16": abs(float(l8 - lb)) / float(lb),
            "grad_h_vs_math": float((gh8 - gd @ wd).norm() / (gd @ wd).norm()),
            "grad_w_vs_math": float((gw8 - gd.t() @ hd).norm() / (gd.t() @ hd).norm()),
            "grad_h_cos_bf16": float(F.cosine_similarity(gh8.flatten(), ghb.flatten(), dim=0)),
            "grad_w_cos_bf16": float(F.cosine_similarity(gw8.flatten(), gwb.flatten(), dim=0))}
    gpu_record(vocab=vocab, chunk=chunk, **errs)
    # the GPU's logits are BF16 (one rounding) and its E5M2 casts may round a tie otherwise: a few 1e-3 of the math
    assert errs["loss_vs_math"] < 1e-3 and errs["grad_h_vs_math"] < 0.02 and errs["grad_w_vs_math"] < 0.02, errs
    assert errs["loss_vs_bf16"] < 0.01 and errs["grad_h_cos_bf16"] > 0.98 and errs["grad_w_cos_bf16"] > 0.98, errs


def test_the_triton_kernel_writes_the_e5m2_gradient_as_a_cast_of_the_math(gpu_record):
    """The chunk kernel writing the FP8 head's gradient straight into an E5M2 buffer (no cast pass): each element
    the fp32 math's gradient rounded once to E5M2 (the interpreter on a CPU cannot check this rounding)."""
    te_or_skip()
    import torch

    from fp8lab.train import ce_kernel, fused_loss

    if not ce_kernel.available("cuda"):
        pytest.skip("Triton does not run here")
    h, w, t = _case(2048, 128_256, 2048)
    logits = h @ w.t()
    v = torch.ones_like(t, dtype=torch.bool)
    scale = torch.tensor(2.0 ** 15 / t.numel(), device="cuda")  # (1 / count times the head's gradient multiplier)
    _, want = fused_loss._chunk_math_eager(logits.float(), t, v, scale)
    out = torch.empty(logits.shape, device="cuda", dtype=torch.float8_e5m2)
    before = logits.clone()
    _, got = ce_kernel.chunk_math(logits, t, v, scale, out=out)
    want8 = want.to(torch.float8_e5m2).float()
    same = float((got.float() == want8).float().mean())
    step = float(((got.float() - want8).abs() - want8.abs() * 2.0 ** -2).max())  # within one E5M2 step
    gpu_record(same_fraction=same, beyond_one_step=step)
    assert got.data_ptr() == out.data_ptr() and torch.equal(logits, before)
    assert same > 0.99 and step <= 2.0 ** -16, (same, step)


def test_the_tiled_transpose_is_torchs_copy_on_the_gpu():
    """fp8lab.train.fp8_transpose's Triton kernel on the GPU: byte for byte x.t().contiguous(), partial tiles too
    (no Transformer Engine needed)."""
    import torch

    from fp8lab.train import ce_kernel, fp8_transpose

    if not torch.cuda.is_available() or not ce_kernel.available("cuda"):
        pytest.skip("needs a CUDA GPU with Triton")
    fp8_transpose.FAILED.clear()
    g = torch.Generator("cuda").manual_seed(3)
    for shape in ((4096, 128_256), (1000, 2050), (16, 16)):
        for dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            x = torch.randn(*shape, device="cuda", generator=g).to(dtype)
            y = fp8_transpose.transpose(x)
            assert y.is_contiguous() and torch.equal(y.view(torch.uint8), x.t().contiguous().view(torch.uint8))
    assert fp8_transpose.FAILED == {}  # the kernel ran (no fallback to PyTorch's copy)


TINY = dict(model="llama-tiny", seq_len=128, micro_batch_size=4, grad_accum=2, lr=2e-3, progress="off",
            print_metrics=False, plot=False, device="cuda", backend="te", param_dtype="bf16", save_model=False,
            checkpoint_every=-1, steps=8, val_every=8, val_batches=1, precision="fp8", fused_loss="on")


def test_the_trainer_runs_the_head_in_fp8_in_its_chunks_and_trains_alike(prepared, tmp_path, gpu_record, monkeypatch):
    te_or_skip()
    import torch

    calls = {}
    real = torch._scaled_mm

    def counted(*a, **kw):  # the head's FP8 GEMMs (TE's own GEMMs do not go through torch._scaled_mm)
        calls[head] = calls.get(head, 0) + 1
        return real(*a, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", counted)
    runs = {}
    for head in (True, False):
        out = tmp_path / str(head)
        s = train(TrainConfig(**TINY, fp8_lm_head=head, data=str(prepared), output_dir=str(out)))
        assert s["status"] == "completed" and s["nonfinite_steps"] == 0
        recs = fmetrics.read_metrics(out / "metrics.jsonl")
        runs[head] = ([r["loss"] for r in recs], recs[-1].get("val_loss"), json.loads((out / "config.json").read_text()))
    (lf, vf, cf), (lb, vb, cb) = runs[True], runs[False]
    assert cf["fp8_lm_head"] is True and cb["fp8_lm_head"] is False and cf["fused_loss"] == "on"
    assert "in each chunk of the fused loss" in cf["plan"]["reasons"]["fp8_lm_head"]
    assert calls.get(True, 0) >= 3 * 8 * 2 and not calls.get(False)  # 3 GEMMs x 8 steps x 2 micro-batches; BF16 0
    worst = max(abs(a - b) / abs(b) for a, b in zip(lf, lb))
    gpu_record(max_rel_loss_diff=worst, val_loss_bf16_head=vb, val_loss_fp8_head=vf)
    assert abs(lf[0] - lb[0]) / lb[0] < 1e-2 and worst < 5e-2 and abs(vf - vb) / vb < 5e-2, (lf, lb)
    assert lf[-1] < lf[0] - 0.3
