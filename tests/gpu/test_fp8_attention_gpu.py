"""TE's FP8 attention against BF16 attention at real widths (issue 34; skipped without an FP8 GPU).

A Llama-3.2-3B-shaped attention (24 query heads, 8 KV heads, head_dim 128, causal) at 4096 tokens:
the same ``te.DotProductAttention`` module and inputs, once inside TE's FP8 region with fp8lab's
``Recipe(fp8_attention=True)`` (``DelayedScaling(fp8_dpa=True)``) and once with FP8 off. The forward
output and the gradients of Q, K and V must stay within relative-error bounds (norm of the difference
over the norm of the BF16 result) and must differ from BF16 at all (FP8 really ran, no silent BF16
fallback). The measured errors are recorded through ``gpu_record`` ($FP8LAB_GPU_RESULTS; study part D sets it).
Measured on the H200 (session 10, TE 2.20.2, ``benchmarks/logs/long-context-session10/``): forward 0.055;
gradients 0.086-0.107 with NVTE_FP8_DPA_BWD=1 (TE's default, FP8 backward) and 0.017-0.023 with 0 (BF16
backward). The bounds sit just above the FP8-backward figures."""
from __future__ import annotations

import pytest
from gpu_skips import te_or_skip as _te_or_skip

pytestmark = pytest.mark.gpu
FWD_BOUND, GRAD_BOUND = 0.06, 0.12
# The one-block model's logits, FP8 attention against FP8 GEMMs with BF16 attention (random init, 3 forwards to
# fill the amax history): 0.114 on the H200 in session 11 (benchmarks/logs/session11/gpu-tests.log), where the
# attention-level FWD_BOUND had been assumed: twice the attention-level error, not yet explained. Bounded at 0.2,
# far below the ~1.41 of two unrelated logit tensors of equal norm; the loss check (study_long_context.sh part D)
# is the measure that counts.
MODEL_BOUND = 0.2
SEQ, BATCH, HEADS, KV_HEADS, HEAD_DIM = 4096, 2, 24, 8, 128




def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("bwd", ["1", "0"])
def test_fp8_attention_matches_bf16_attention_at_3b_widths(bwd, monkeypatch, gpu_record):
    _te_or_skip()
    import torch
    import transformer_engine
    import transformer_engine.pytorch as te

    from fp8lab.fp8.backends.te import TEBackend
    from fp8lab.fp8.recipe import Recipe

    monkeypatch.setenv("NVTE_FP8_DPA_BWD", bwd)
    torch.manual_seed(0)
    attn = te.DotProductAttention(HEADS, HEAD_DIM, num_gqa_groups=KV_HEADS, attention_dropout=0.0, qkv_format="bshd",
                                  attn_mask_type="causal", layer_number=1)
    q = torch.randn(BATCH, SEQ, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(BATCH, SEQ, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(BATCH, SEQ, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    dout = torch.randn(BATCH, SEQ, HEADS * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    backend = TEBackend()

    def run(fp8: bool):
        xs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        with backend.autocast(Recipe(fp8_attention=True), enabled=fp8):
            out = attn(*xs)
        out.backward(dout)
        return out.detach(), [x.grad for x in xs]

    ref, ref_grads = run(False)
    for _ in range(3):  # delayed scaling: the first steps fill the amax history the scales come from
        run(True)
    out, grads = run(True)
    errs = {"out": _rel(out, ref), **{f"d{n}": _rel(g, r) for n, g, r in zip("qkv", grads, ref_grads)}}
    gpu_record(nvte_fp8_dpa_bwd=bwd, relative_error=errs, shape=[BATCH, SEQ, HEADS, KV_HEADS, HEAD_DIM],
               gpu=torch.cuda.get_device_name(), te=transformer_engine.__version__)
    assert errs["out"] > 1e-4, "FP8 attention gave the BF16 result: TE fell back to BF16 attention"
    assert errs["out"] <= FWD_BOUND, errs
    assert max(errs["dq"], errs["dk"], errs["dv"]) <= GRAD_BOUND, errs


def test_the_fused_model_runs_its_attention_in_fp8_under_the_plan_recipe():
    """fp8lab's fused blocks use te.DotProductAttention: the plan's recipe with fp8_attention changes their output.
    One model per setting, built alike (the trainer keeps one recipe for a model's life): switching a module from
    FP8 with BF16 attention to FP8 attention between calls made TE 2.20 assert ("cuDNN attention sub-backend 2
    is required for FP8 attention", session 10's H200 run)."""
    _te_or_skip()
    import gc

    import torch

    from fp8lab.fp8.backends.te import TEBackend
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe

    backend = TEBackend()
    x = torch.randint(0, 32000, (1, 4096), device="cuda")
    logits = {}
    for attn in (False, True):
        torch.manual_seed(0)
        model = build_model("llama-1b", device="cuda", dtype=torch.bfloat16, num_layers=1, hidden_size=3072,
                            intermediate_size=8192, num_heads=24, num_kv_heads=8, vocab_size=32000, max_seq_len=4096)
        model = convert_model(model, "te", fuse=True)
        for _ in range(3):  # fill the amax history
            with backend.autocast(Recipe(fp8_attention=attn)):
                logits[attn] = model(x).logits.float().detach()
        del model
        gc.collect()
        torch.cuda.empty_cache()  # leave no GPU memory to the tests after this one (the graphs tests measure captures)
    err = _rel(logits[True], logits[False])
    assert err > 1e-4  # the attention really ran in FP8
    assert err < MODEL_BOUND, err  # and gave logits near BF16 attention's
