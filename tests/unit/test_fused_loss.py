"""The fused linear cross-entropy (fp8lab.train.fused_loss, issue 51) against the plain path, in fp32 on the CPU:
loss within 1e-4 relative, gradients of the head and of the last hidden states within 1e-3, tied
embeddings included (Llama-3.2 / Qwen2.5-style configs), and the decision and memory rules."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fp8lab.train import fused_loss
from fp8lab.train.fused_loss import linear_cross_entropy


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _plain(h, w, y):
    return F.cross_entropy((h @ w.t()).float().reshape(-1, w.shape[0]), y.reshape(-1), ignore_index=-100)


@pytest.mark.parametrize("chunk", [7, 64, 1000])  # several uneven chunks, and one chunk holding all tokens
def test_matches_plain_path_fp32(chunk):
    g = torch.Generator().manual_seed(chunk)
    h0 = torch.randn(3, 50, 32, generator=g)
    w0 = torch.randn(97, 32, generator=g) * 0.3
    y = torch.randint(0, 97, (3, 50), generator=g)
    h1, w1 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = _plain(h1, w1, y)
    (ref * 0.25).backward()  # the trainer divides by the accumulation
    got = linear_cross_entropy(h2, w2, y, chunk=chunk)
    (got * 0.25).backward()
    assert abs(got.item() - ref.item()) / abs(ref.item()) < 1e-4
    assert rel(h2.grad, h1.grad) < 1e-3
    assert rel(w2.grad, w1.grad) < 1e-3
    assert h2.grad.dtype == h0.dtype and w2.grad.dtype == w0.dtype


def test_ignore_index_counts_only_real_targets():
    g = torch.Generator().manual_seed(3)
    h = torch.randn(40, 16, generator=g, requires_grad=True)
    w = torch.randn(33, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 33, (40,), generator=g)
    y[::3] = -100
    ref = _plain(h, w, y)
    gh, gw = torch.autograd.grad(ref, (h, w))
    got = linear_cross_entropy(h, w, y, chunk=9)
    fh, fw = torch.autograd.grad(got, (h, w))
    assert abs(got.item() - ref.item()) / ref.item() < 1e-4
    assert rel(fh, gh) < 1e-3 and rel(fw, gw) < 1e-3
    assert float(fh[::3].abs().max()) == 0.0  # ignored tokens get no gradient


def test_no_grad_forward_is_the_loss_only():
    h, w = torch.randn(20, 8), torch.randn(11, 8)
    y = torch.randint(0, 11, (20,))
    with torch.no_grad():
        got = linear_cross_entropy(h, w, y, chunk=6)
    assert abs(float(got) - float(_plain(h, w, y))) < 1e-5


def _tiny(family: str, tied: bool):
    """A real transformers model of the Llama-3.2 (tied) / Qwen2.5 (tied, qkv bias) kind, tiny and fp32."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(vocab_size=211, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=tied)
    torch.manual_seed(0)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                    "original_max_position_embeddings": 16}))
    return Qwen2ForCausalLM(Qwen2Config(**common))


@pytest.mark.parametrize("family,tied", [("llama", True), ("qwen2", True), ("llama", False)])
def test_installed_head_matches_plain_model(family, tied):
    """The head computes the loss inside the model's forward: same loss, same gradients (tied weights included)."""
    import copy

    plain = _tiny(family, tied)
    fused = copy.deepcopy(plain)
    fused_loss.install(fused)
    assert fused_loss.installed(fused) and (fused.lm_head.weight is fused.model.embed_tokens.weight) == tied
    assert set(fused.state_dict()) == set(plain.state_dict())  # checkpoints and export unchanged
    x = torch.randint(0, 211, (2, 24), generator=torch.Generator().manual_seed(1))
    y = torch.roll(x, -1, dims=1)
    ref = F.cross_entropy(plain(x).logits.float().reshape(-1, 211), y.reshape(-1))
    ref.backward()
    with fused_loss.targets(fused, y):
        got = fused(x).logits  # the head returned the loss
    got.backward()
    assert got.dim() == 0 and abs(got.item() - ref.item()) / ref.item() < 1e-4
    assert rel(fused.lm_head.weight.grad, plain.lm_head.weight.grad) < 1e-3
    for (n, p), q in zip(fused.named_parameters(), plain.parameters()):  # the last hidden states' gradient flows on
        assert rel(p.grad, q.grad) < 1e-3, n
    with torch.no_grad():  # without targets the head is a plain Linear again (generation, export)
        assert torch.allclose(fused(x).logits, plain(x).logits)


def test_install_refuses_a_head_with_bias():
    m = torch.nn.Module()
    m.lm_head = torch.nn.Linear(4, 7, bias=True)
    with pytest.raises(ValueError, match="--fused-loss: the LM head has a bias"):
        fused_loss.install(m)


def test_decide_rule():
    on, why = fused_loss.decide("auto", vocab=128_256, tokens_per_micro_batch=32_768, gpu=True)
    assert on and "auto" in why
    assert fused_loss.decide("auto", vocab=32_000, tokens_per_micro_batch=32_768, gpu=True)[0]  # llama-1b, measured
    off, why = fused_loss.decide("auto", vocab=32_000, tokens_per_micro_batch=4096, gpu=True)  # llama-7b's 2 x 2048
    assert not off and "the plain loss" in why
    assert not fused_loss.decide("auto", vocab=151_936, tokens_per_micro_batch=32_768, gpu=False)[0]
    assert fused_loss.decide("on", vocab=100, tokens_per_micro_batch=4, gpu=False)[0]
    assert not fused_loss.decide("off", vocab=151_936, tokens_per_micro_batch=32_768, gpu=True)[0]
    with pytest.raises(ValueError, match=r"--fused-loss='maybe' is invalid; allowed: auto \| on \| off"):
        fused_loss.decide("maybe", vocab=1, tokens_per_micro_batch=1, gpu=True)


def test_loss_bytes_is_far_below_the_full_logits():
    v, h, n = 128_256, 2048, 32_768
    assert fused_loss.chunk_tokens(v, n) * v * 4 <= fused_loss.CHUNK_LOGIT_BYTES
    assert fused_loss.loss_bytes(vocab=v, hidden=h, tokens_per_micro_batch=n) < 0.2 * 16 * v * n


def test_the_compiled_form_of_the_chunk_math_is_the_same_function():
    """``_chunk_math`` (what torch.compile gets on CUDA) against the in-place eager form, uncompiled here."""
    from fp8lab.train.fused_loss import _chunk_math, _chunk_math_eager

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(13, 41, generator=g)
    t = torch.randint(0, 41, (13,), generator=g)
    v = torch.ones(13, dtype=torch.bool)
    v[4] = False
    scale = torch.tensor(1.0 / 12)
    (la, ga), (lb, gb) = _chunk_math(logits, t, v, scale), _chunk_math_eager(logits.clone(), t, v, scale)
    assert torch.allclose(la, lb, rtol=1e-6) and torch.allclose(ga, gb, atol=1e-7)
    assert float(ga[4].abs().max()) == 0.0


def test_a_sagemaker_job_carries_the_plans_fused_loss_and_takes_an_explicit_one():
    """JobSpec: ``auto`` becomes the launch plan's on/off (the instance re-plans nothing of it); ``off`` passes as given."""
    from fp8lab import launch as L

    base = dict(precision="fp8", role=L.PLACEHOLDER_ROLE, bucket=L.PLACEHOLDER_BUCKET, tokens=10**9)
    spec = L.JobSpec(model="llama-1b", **base)  # P5: 8 x H100, micro-batch x 2048 x 32,000 logits >= the threshold
    assert spec.plan.fused_loss is True
    assert L.hyperparameters(spec)["fused-loss"] == "on"
    off = L.JobSpec(model="llama-1b", options={"fused_loss": "off"}, **base)
    assert off.plan.fused_loss is False and L.hyperparameters(off)["fused-loss"] == "off"
    with pytest.raises(ValueError, match="fused"):
        L.JobSpec(model="llama-1b", options={"fused_loss": "maybe"}, **base)
