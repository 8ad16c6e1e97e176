"""Named model configs: real HF classes, counts from the config, validated overrides, FLOPs formula."""
from __future__ import annotations

import pytest
import torch

from fp8lab.model import models
from fp8lab.model.models import MODEL_CONFIGS, build_model, count_parameters, list_models, model_flops_per_token


@pytest.mark.parametrize("name", ["llama-tiny", "gptneo-tiny"])
def test_tiny_models_are_real_hf_and_counts_match(name):
    from transformers import GPTNeoForCausalLM, LlamaForCausalLM

    m = build_model(name)
    assert isinstance(m, LlamaForCausalLM if name.startswith("llama") else GPTNeoForCausalLM)
    assert count_parameters(m).total == sum(p.numel() for p in m.parameters())
    out = m(input_ids=torch.randint(0, 512, (2, 32)), labels=torch.randint(0, 512, (2, 32)))
    assert out.logits.shape == (2, 32, 512) and torch.isfinite(out.loss)
    for n, p in m.named_parameters():  # FP8 GEMMs need multiples of 16
        assert all(d % 16 == 0 for d in p.shape), (n, p.shape)


def test_seed_makes_weights_reproducible_and_leaves_global_rng():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = build_model("llama-tiny", seed=1), build_model("llama-tiny", seed=1)
    after = torch.rand(1)
    assert torch.equal(before, after)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    c = build_model("llama-tiny", seed=2)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)


@pytest.mark.parametrize("name", list(MODEL_CONFIGS))
def test_meta_build_counts_match_config_counts(name):
    m = build_model(name, device="meta")
    assert next(m.parameters()).device.type == "meta"
    assert count_parameters(name).total == sum(p.numel() for p in m.parameters())


def test_published_shapes_and_sizes():
    rows = {r["name"]: r for r in list_models()}
    assert set(rows) >= {"llama-tiny", "llama-1b", "llama-7b", "gptneo-tiny", "gptneo-125m", "gptneo-1.3b"}
    assert abs(rows["llama-1b"]["params"] / 1.1e9 - 1) < 0.01  # TinyLlama: 1.100B
    assert abs(rows["llama-7b"]["params"] / 6.74e9 - 1) < 0.01  # Llama-2-7B: 6.738B
    assert abs(rows["gptneo-125m"]["params"] / 125.2e6 - 1) < 0.01
    assert abs(rows["gptneo-1.3b"]["params"] / 1.3157e9 - 1) < 0.01
    assert rows["llama-1b"]["num_kv_heads"] == 4 and rows["gptneo-1.3b"]["window_size"] == 256
    hf = models.to_hf_config(MODEL_CONFIGS["gptneo-125m"])
    assert hf.attention_layers == ["global", "local"] * 6


def test_bf16_dtype_and_default_dtype_restored():
    m = build_model("gptneo-tiny", dtype=torch.bfloat16)
    assert next(m.parameters()).dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32


def test_overrides_applied_and_validated():
    m = build_model("gptneo-tiny", num_layers=3, window_size=8)
    assert m.config.num_layers == 3 and m.config.attention_layers == ["global", "local", "global"]
    assert m.config.window_size == 8
    with pytest.raises(ValueError, match="valid overrides: .*hidden_size"):
        build_model("llama-tiny", n_layer=2)
    with pytest.raises(ValueError, match="unknown model 'gpt2'.*llama-tiny"):
        build_model("gpt2")
    with pytest.raises(ValueError, match="num_layers must be a positive integer"):
        build_model("llama-tiny", num_layers=0)
    with pytest.raises(ValueError, match="divisible by num_heads"):
        build_model("llama-tiny", hidden_size=66)
    with pytest.raises(ValueError, match="num_kv_heads must be a positive divisor"):
        build_model("llama-tiny", num_kv_heads=3)
    with pytest.raises(ValueError, match="window_size applies to GPT-Neo only"):
        build_model("llama-tiny", window_size=4)
    with pytest.raises(ValueError, match="dtype must be a floating"):
        build_model("llama-tiny", dtype=torch.int8)


def test_flops_formula():
    c = MODEL_CONFIGS["gptneo-tiny"]
    pc = count_parameters(c)
    # matmul params: blocks + final norm + tied LM head (counted), embeddings excluded
    assert pc.matmul == pc.blocks + pc.final_norm + c.vocab_size * c.hidden_size
    t = 64  # > window 16: the local layer attends to 16 keys
    expected = 6 * pc.matmul + 12 * c.hidden_size * (t + c.window_size)
    assert model_flops_per_token(c, t) == expected
    assert model_flops_per_token(build_model("gptneo-tiny", device="meta"), t) == expected
    # Llama-2-7B at 4096 tokens: N = 6.738e9 params - 0.131e9 embedding table = 6.607e9;
    # attention 12 * 32 layers * 4096 (heads x head_dim) * 4096 keys = 6.44e9
    f7 = model_flops_per_token("llama-7b", 4096)
    assert f7 == 6 * (count_parameters("llama-7b").total - 32000 * 4096) + 12 * 32 * 4096 * 4096
    assert abs(f7 / 4.609e10 - 1) < 1e-3
    with pytest.raises(ValueError, match="seq_len"):
        model_flops_per_token(c, 0)
    with pytest.raises(ValueError, match="unsupported architecture"):
        model_flops_per_token(object(), 8)


def test_a_frozen_base_counts_four_flops_per_parameter_and_its_adapters_six():
    from fp8lab.model.models import MODEL_CONFIGS, count_parameters, model_flops_per_token
    from fp8lab.plan import lora as lora_plan

    c = MODEL_CONFIGS["llama-1b"]
    full = model_flops_per_token(c, 2048)
    adapters = lora_plan.adapter_params(c, 16, lora_plan.parse_targets(lora_plan.ALL, c.family))
    lora = model_flops_per_token(c, 2048, adapters)
    n = count_parameters(c).matmul
    # the attention term is the same in both: forward and backward run through every block either way
    assert full - lora == pytest.approx(2 * n - 6 * adapters)
    assert 0.6 < lora / full < 0.75
