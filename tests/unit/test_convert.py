"""CPU tests of the conversion API through the emulated backend (both families x both fuse levels),
the weight round trip back to Hugging Face, the recipe mapping and every error path."""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from torch import nn

from fp8lab.fp8 import formats
from fp8lab.fp8.backends import BackendUnavailableError, available_backends, fp8_gpu_problem
from fp8lab.fp8.backends import emulated
from fp8lab.fp8.convert import (
    edge_blocks_filter,
    Recipe, autocast, check_equivalence, convert_model, describe_modules, export_hf_model, export_hf_state_dict,
    pick_backend, save_hf_checkpoint, time_forward_backward, weight_mapping,
)
from fp8lab.fp8.recipe import KINDS
from fp8lab.model.models import build_model

CASES = [(fam, fuse) for fam in ("llama-tiny", "gptneo-tiny") for fuse in (False, True)]


def _ids(seed=0, b=2, t=48):  # t=48 > gptneo-tiny's window of 16: local layers are exercised
    return torch.randint(0, 512, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(params=CASES, ids=[f"{f}-{'fused' if u else 'swap'}" for f, u in CASES])
def pair(request):
    name, fuse = request.param
    hf = build_model(name)
    ref = copy.deepcopy(hf)
    return ref, convert_model(hf, backend="emulated", fuse=fuse), fuse


def test_fp8_off_matches_hf_and_fp8_on_reports_error(pair):
    ref, conv, fuse = pair
    off = check_equivalence(ref, conv, _ids(), per_layer=True)
    assert off.logits_rel_diff < 1e-5 and off.loss_rel_diff < 1e-5, off
    assert len(off.per_layer) == 2 and all(d.rel_diff < 1e-5 for d in off.per_layer)
    on = check_equivalence(ref, conv, _ids(), per_layer=True, fp8=True)
    assert on.fp8 and "delayed" in on.recipe
    # E4M3 has 3 mantissa bits: relative rounding error ~2-6% per tensor; it must show and stay bounded
    assert 1e-3 < on.logits_rel_diff < 0.2, on
    assert on.loss_abs_diff < 0.05
    assert all(0 < d.rel_diff < 0.2 for d in on.per_layer)
    assert [d.name.split(".")[-1] for d in on.per_layer] == ["0", "1"]


def test_round_trip_back_to_hf_is_exact(pair):
    ref, conv, _ = pair
    sd = export_hf_state_dict(conv)
    fresh = type(ref)(ref.config)
    fresh.load_state_dict(sd, strict=True)
    ref_sd = ref.state_dict()
    assert set(sd) == set(ref_sd) and all(torch.equal(sd[k], ref_sd[k]) for k in sd)


def test_training_in_fp8_then_export_keeps_the_trained_weights(pair):
    ref, conv, fuse = pair
    opt = torch.optim.SGD(conv.parameters(), lr=0.5)
    ids = _ids(1)
    with autocast("emulated"):
        loss = conv(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in conv.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    opt.step()
    hf = export_hf_model(conv)
    assert type(hf) is type(ref)
    changed = sum(not torch.equal(a, b) for a, b in zip(hf.state_dict().values(), ref.state_dict().values()))
    assert changed > 5
    with torch.no_grad():  # the exported HF model computes what the trained converted model does (FP8 off)
        a, b = hf(input_ids=ids).logits, conv(input_ids=ids).logits
    assert (a - b).norm() / a.norm() < 1e-5


@pytest.mark.parametrize("name", ["gptneo-tiny", "llama-tiny"])
def test_checkpoints_load_with_from_pretrained(tmp_path, name):
    ref = build_model(name)
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True)
    export_hf_model(conv).save_pretrained(tmp_path / "a")
    files = save_hf_checkpoint(conv, tmp_path / "b")  # written without building the HF model
    assert [p.rsplit("/", 1)[-1] for p in files] == ["config.json", "model.safetensors"]
    ids = _ids()
    for d in ("a", "b"):
        back = type(ref).from_pretrained(tmp_path / d)
        assert all(torch.equal(v, ref.state_dict()[k]) for k, v in back.state_dict().items())
        with torch.no_grad():
            assert torch.equal(back(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_fp8_gemm_quantises_inputs_in_e4m3_and_grads_in_e5m2():
    torch.manual_seed(0)
    lin = emulated.EmuLinear(32, 16)
    x = torch.randn(4, 32, requires_grad=True)
    rec = Recipe(kind="current")
    with autocast("emulated", rec):
        y = lin(x)
    g = torch.randn_like(y)
    y.backward(g)
    xq, wq = formats.quantize_current(x.detach(), formats.E4M3), formats.quantize_current(lin.weight.detach(), formats.E4M3)
    gq = formats.quantize_current(g, formats.E5M2)
    torch.testing.assert_close(y, xq @ wq.t() + lin.bias, rtol=0, atol=1e-6)
    torch.testing.assert_close(lin.weight.grad, gq.t() @ xq, rtol=0, atol=1e-6)
    torch.testing.assert_close(x.grad, gq @ wq, rtol=0, atol=1e-6)
    assert not torch.equal(gq, g)  # the gradient really was rounded


def test_delayed_scaling_state_per_tensor():
    lin = emulated.EmuLinear(32, 16)
    rec = Recipe(amax_history_len=4)
    for i in range(6):
        with autocast("emulated", rec):
            lin(torch.randn(8, 32) * (i + 1)).sum().backward()
    q = lin.__dict__["_fp8lab_q"]
    assert {r: d.steps for r, d in q.delayed.items()} == {"x": 6, "w": 6, "g": 6}
    assert len(q.delayed["x"].history) == 4  # the history is bounded by amax_history_len
    assert q.delayed["x"].scale == pytest.approx(448 / q.delayed["x"].amax)
    assert q.delayed["g"].fmt.name == "E5M2"
    assert emulated.TensorQuantizers(Recipe(format="e4m3")).fmt["g"].name == "E4M3"


# every kind of the recipe table (fp8lab.fp8.recipe.TABLE) but the default, which runs with settings of its own
@pytest.mark.parametrize("recipe", [k for k in KINDS if k != Recipe().kind] + [Recipe(format="e4m3", margin=1)], ids=str)
def test_every_recipe_runs_forward_and_backward(recipe):
    ref = build_model("llama-tiny")
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True, recipe=recipe)
    rep = check_equivalence(ref, conv, _ids(), fp8=True)
    assert 1e-3 < rep.logits_rel_diff < 0.2
    with autocast("emulated", recipe):
        conv(input_ids=_ids(), labels=_ids()).loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in conv.parameters())


def test_module_filter_unfused_and_fused():
    ref = build_model("llama-tiny")
    only_attn = convert_model(copy.deepcopy(ref), backend="emulated", fuse=False,
                              module_filter=lambda m, fqn: "self_attn" in fqn)
    assert type(only_attn.model.layers[0].mlp.up_proj) is nn.Linear
    assert isinstance(only_attn.model.layers[0].self_attn.q_proj, emulated.EmuLinear)
    assert type(only_attn.lm_head) is nn.Linear
    assert "lm_head" in only_attn.fp8lab_conversion.high_precision
    skip_first = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True,
                               module_filter=lambda m, fqn: fqn != "model.layers.0")
    rep = check_equivalence(ref, skip_first, _ids(), per_layer=True, fp8=True)
    assert rep.per_layer[0].rel_diff < 1e-5 < rep.per_layer[1].rel_diff  # block 0 stayed high precision
    assert "blocks.0" in skip_first.fp8lab_conversion.high_precision


def test_notebook_helpers():
    ref = build_model("llama-tiny")
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True)
    rows = weight_mapping(conv, layer=0)
    qkv = next(r for r in rows if r["converted_key"] == "blocks.0.qkv.weight")
    assert qkv["rule"] == "concat dim 0" and qkv["converted_shape"] == "(128, 64)"  # 64 q + 2 x 32 kv rows
    assert all("layers.1" not in r["hf_keys"] for r in rows)
    tree = describe_modules(conv)
    assert "EmuLayerNormLinear" in tree and "1 more decoder blocks" in tree
    assert "LlamaDecoderLayer" in describe_modules(ref)
    assert pick_backend("auto") == ("te" if available_backends()["te"] is None else "emulated")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            time_forward_backward(conv, _ids())


def test_edge_blocks_filter_keeps_first_and_last_blocks_out_of_fp8():
    ref = build_model("llama-tiny", num_layers=4)
    fused = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True, module_filter=edge_blocks_filter(ref, 1))
    assert [b.fp8 for b in fused.blocks] == [False, True, True, False]
    rep = check_equivalence(ref, fused, _ids(), per_layer=True, fp8=True)
    assert rep.per_layer[0].rel_diff < 1e-5 < rep.per_layer[1].rel_diff
    swapped = convert_model(copy.deepcopy(ref), backend="emulated", fuse=False, module_filter=edge_blocks_filter(ref, 1))
    kinds = [isinstance(swapped.model.layers[i].mlp.up_proj, emulated.EmuLinear) for i in range(4)]
    assert kinds == [False, True, True, False] and type(swapped.lm_head) is nn.Linear
    assert edge_blocks_filter(ref, 0)(None, "model.layers.0") is True
    with pytest.raises(ValueError, match=r"n must be an integer in \[0, 1\] for a model of 4 blocks"):
        edge_blocks_filter(ref, 2)


def test_recipe_strings_carry_settings_and_round_trip():
    r = Recipe.parse("delayed:amax_history_len=16,amax_compute_algo=most_recent,margin=1")
    assert (r.kind, r.amax_history_len, r.amax_compute_algo, r.margin, r.format) == ("delayed", 16, "most_recent", 1, "hybrid")
    assert Recipe.parse(r.spec()) == r and Recipe.parse("current").spec() == "current"
    assert Recipe.parse("current:format=e4m3") == Recipe(kind="current", format="e4m3")
    for bad, msg in [("delayed:history=16", "not key=value with a key among"), ("delayed:margin=x", "margin must be an integer"),
                     ("current:amax_history_len=16", "apply to 'delayed' only"), ("delayed:margin=-1", "margin"),
                     ("fast:margin=1", "one of")]:
        with pytest.raises(ValueError, match=msg):
            Recipe.parse(bad)


def test_recipe_validation_and_mapping():
    r = Recipe()
    assert (r.kind, r.format, r.amax_history_len, r.amax_compute_algo, r.margin) == ("delayed", "hybrid", 1024, "max", 0)
    with pytest.raises(ValueError, match="kind must be one of"):
        Recipe(kind="nvfp4")
    with pytest.raises(ValueError, match="format must be one of"):
        Recipe(format="e5m2")
    with pytest.raises(ValueError, match="format='e4m3'"):
        Recipe(kind="mxfp8")
    with pytest.raises(ValueError, match="amax_compute_algo"):
        Recipe(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="margin"):
        Recipe(margin=-1)
    assert Recipe.parse("block") == Recipe(kind="block", format="e4m3")
    with pytest.raises(ValueError, match="per tensor or per row"):
        Recipe().to_torchao()
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.kind = "current"


def test_clear_errors_before_compute(monkeypatch):
    with pytest.raises(ValueError, match="unsupported architecture.*LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, GPTNeoForCausalLM"):
        convert_model(nn.Sequential(nn.Linear(16, 16)), backend="emulated")
    with pytest.raises(ValueError, match="backend must be one of emulated, te, torchao"):
        convert_model(build_model("llama-tiny"), backend="tensorrt")
    odd = build_model("llama-tiny", hidden_size=72, num_heads=4, num_kv_heads=4)
    with pytest.raises(ValueError, match=r"layer model\.layers\.0\.self_attn\.q_proj has shape \(out=72, in=72\)"):
        convert_model(odd, backend="emulated", fuse=False)
    with pytest.raises(ValueError, match=r"blocks\.0\.qkv .*divisible by 16"):
        convert_model(odd, backend="emulated", fuse=True)
    m = convert_model(build_model("llama-tiny"), backend="emulated", fuse=False)
    with pytest.raises(ValueError, match="already converted"):
        convert_model(m, backend="emulated")
    with pytest.raises(ValueError, match="fuse must be True or False"):
        convert_model(build_model("llama-tiny"), backend="emulated", fuse="yes")
    with pytest.raises(ValueError, match="not a converted model"):
        export_hf_state_dict(build_model("llama-tiny"))
    with pytest.raises(ValueError, match="enabled must be True or False"):
        autocast("emulated", enabled=1)


@pytest.mark.skipif(available_backends()["te"] is None, reason="TE is usable here: the unavailable path cannot be shown")
def test_missing_backend_says_how_to_install_and_what_works():
    with pytest.raises(BackendUnavailableError, match=r"backend 'te' is not usable here: .*Usable on this machine: emulated"):
        convert_model(build_model("llama-tiny"), backend="te")
    reasons = available_backends()
    assert reasons["emulated"] is None
    assert "pip install" in reasons["te"] or "GPU" in reasons["te"]


def test_gpu_without_fp8_is_named(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA A100-SXM4-80GB")
    msg = fp8_gpu_problem()
    assert "NVIDIA A100-SXM4-80GB" in msg and "8.0" in msg and "8.9" in msg


@pytest.mark.parametrize("fuse", [False, True], ids=["swap", "fused"])
def test_fp8_under_torch_autocast_with_fp32_master_weights(fuse):
    """The trainer's set-up: fp32 parameters, bf16 compute via torch.autocast, FP8 GEMMs inside."""
    ref = build_model("gptneo-tiny")
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=fuse)
    ids = _ids()
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast("emulated"):
        out = conv(input_ids=ids, labels=ids)
    out.loss.backward()
    assert out.logits.dtype == torch.bfloat16
    assert all(p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all() for p in conv.parameters())
    with torch.no_grad():
        ref_loss = ref(input_ids=ids, labels=ids).loss
    assert abs(float(out.loss.detach()) - float(ref_loss)) < 0.05


def test_fused_model_accepts_the_micro_batch_flag_and_reuses_its_rope_tables():
    """Backends without a weight cache ignore is_first_microbatch; RoPE tables are built once per shape."""
    model = convert_model(build_model("llama-tiny", seed=0), backend="emulated", fuse=True)
    assert model.supports_weight_cache is False
    ids = _ids()
    with torch.no_grad():
        plain = model(ids).logits
        flagged = model(ids, is_first_microbatch=False).logits
    torch.testing.assert_close(flagged, plain, atol=0, rtol=0)
    assert list(model._rope_tables) == [(ids.shape[1], "cpu", torch.float32)]
    assert model.state_dict().keys() == convert_model(build_model("llama-tiny", seed=0), backend="emulated",
                                                      fuse=True).state_dict().keys()



def test_te_rope_tables_are_the_angles_of_the_pytorch_rope():
    """TE's fused RoPE takes angles [s, 1, 1, d] in fp32: the same angles as the PyTorch tables (no TE needed)."""
    from fp8lab.fp8.fused import rope_cos_sin
    from fp8lab.fp8.backends.te import TERope

    freqs = TERope().tables(32, 16, 10000.0, "cpu", torch.bfloat16)
    cos, sin = rope_cos_sin(32, 16, 10000.0, "cpu", torch.float32)
    assert freqs.shape == (32, 1, 1, 16) and freqs.dtype == torch.float32 and freqs.is_contiguous()
    torch.testing.assert_close(freqs[:, 0, 0].cos(), cos[0, :, 0], atol=0, rtol=0)
    torch.testing.assert_close(freqs[:, 0, 0].sin(), sin[0, :, 0], atol=0, rtol=0)


# ---------------------------------------------------------------- equivalence against fp32 truth

@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "swap"])
def test_equivalence_against_an_fp32_forward_three_ways(fuse):
    """bf16 on the CPU, emulated backend: both models against an fp32 forward of the same weights, per block."""
    ref = build_model("llama-tiny", device="cpu", dtype=torch.bfloat16, seed=0)
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=fuse)
    ids = _ids()
    rep = check_equivalence(ref, conv, ids, per_layer=True, fp32_reference=True)
    t = rep.fp32
    assert t is not None and t.dtype == "float32"
    assert 0 < t.reference_logits_rel_diff < 0.05  # bf16 rounding, measured against fp32 truth
    assert t.converted_at_least_as_close and t.converted_logits_rel_diff <= t.reference_logits_rel_diff
    assert [lt.name for lt in t.per_layer] == [d.name for d in rep.per_layer] and len(t.per_layer) == 2
    assert all(0 < lt.reference_rel_diff < 0.05 for lt in t.per_layer)
    # the truth is the reference's weights computed in fp32: its loss is the fp32 model's own
    truth = copy.deepcopy(ref).float()
    with torch.no_grad():
        assert t.loss_truth == pytest.approx(float(truth(input_ids=ids, labels=ids).loss), rel=1e-6)
    given = check_equivalence(ref, conv, ids, per_layer=True, fp32_reference=truth)
    assert given.fp32.reference_logits_rel_diff == pytest.approx(t.reference_logits_rel_diff)
    rows = rep.three_way()
    assert [r["where"] for r in rows] == ["logits", "block 0", "block 1"]
    assert rows[0]["reference vs fp32"] == t.reference_logits_rel_diff
    assert rows[1]["converted vs reference"] == rep.per_layer[0].rel_diff
    # with FP8 on, the converted model moves away from the truth by the FP8 error
    on = check_equivalence(ref, conv, ids, per_layer=True, fp8=True, fp32_reference=True)
    assert on.fp32.converted_logits_rel_diff > 3 * on.fp32.reference_logits_rel_diff


def test_fp32_reference_of_an_fp32_model_is_itself_and_old_calls_are_unchanged():
    ref = build_model("llama-tiny", device="cpu", dtype=torch.float32, seed=0)
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True)
    rep = check_equivalence(ref, conv, _ids(), fp32_reference=True)
    assert rep.fp32.reference_logits_rel_diff == 0.0 and rep.fp32.per_layer is None
    old = check_equivalence(ref, conv, _ids(), True)  # the old positional call: no fp32 forward
    assert old.fp32 is None and old.logits_rel_diff == pytest.approx(rep.logits_rel_diff)
    with pytest.raises(ValueError, match="no fp32 truth"):
        old.three_way()


def test_bad_fp32_reference_is_named():
    ref = build_model("llama-tiny", device="cpu", dtype=torch.float32, seed=0)
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True)
    with pytest.raises(ValueError, match="fp32_reference: its parameters must be float32"):
        check_equivalence(ref, conv, _ids(), fp32_reference=copy.deepcopy(ref).to(torch.bfloat16))
    with pytest.raises(ValueError, match="fp32_reference='yes'; allowed"):
        check_equivalence(ref, conv, _ids(), fp32_reference="yes")
    other = build_model("llama-tiny", device="cpu", dtype=torch.float32, seed=0, num_layers=3)
    with pytest.raises(ValueError, match="fp32_reference has 3 blocks, reference 2"):
        check_equivalence(ref, conv, _ids(), per_layer=True, fp32_reference=other)


def test_the_fused_build_holds_one_joined_weight_at_a_time(monkeypatch):
    """build_fused copies each fused weight in and frees it before the next is joined (q|k|v, gate|up): the build's
    peak is the two models and one joined weight (fp8lab.plan.layout.build_bytes), not every joined weight at once."""
    import weakref

    from fp8lab.fp8 import fused

    real_items, real_cat = fused._hf_to_fused_items, torch.cat
    joined, alive_at_join, building = [], [], []

    def cat(*a, **k):  # every joined weight: how many joined before it are still alive when it is made
        out = real_cat(*a, **k)
        if building:
            alive_at_join.append(sum(ref() is not None for ref in joined))
            joined.append(weakref.ref(out))
        return out

    def items(hf_sd, spec):
        building.append(True)
        yield from real_items(hf_sd, spec)
        building.clear()

    monkeypatch.setattr(fused, "_hf_to_fused_items", items)
    monkeypatch.setattr(torch, "cat", cat)
    ref = build_model("llama-tiny", seed=0)
    conv = convert_model(copy.deepcopy(ref), backend="emulated", fuse=True)
    monkeypatch.setattr(torch, "cat", real_cat)
    assert len(joined) == 2 * len(conv.blocks)  # q|k|v and gate|up of each block were joined
    assert alive_at_join and max(alive_at_join) == 0  # each freed before the next was made
    back = fused.fused_to_hf(conv.state_dict(), conv.spec, {k: v.shape for k, v in ref.state_dict().items()})
    for k, v in ref.state_dict().items():  # and every weight arrived
        torch.testing.assert_close(back[k], v, rtol=0, atol=0)
