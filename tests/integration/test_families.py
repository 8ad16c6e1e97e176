"""The model families people bring (issue 27), on CPU at small widths: the published configs of
Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-1.5B and Mistral-7B-v0.3 (``data/reference/configs``) shrunk to a
few hundred thousand parameters, everything else kept (RoPE variant, biases, tying, windows), plus the
other RoPE variants and windows a config can carry. The fused and swapped conversions with FP8 off
reproduce the HF fp32 forward, at sequence lengths past ``original_max_position_embeddings`` and
with windows shorter than the sequence; FP8 on (emulated) stays finite; the export is exact. Bad
folders are refused in one line before anything is built, and no code of a folder ever runs."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from fp8lab.fp8.convert import check_equivalence, convert_model, export_hf_state_dict
from fp8lab.core.paths import REPO_ROOT
from fp8lab.train.entry import TrainConfig

REFERENCE = REPO_ROOT / "data" / "reference" / "configs"
PUBLISHED = ["llama-3.2-1b", "llama-3.1-8b", "qwen2.5-1.5b", "mistral-7b-v0.3"]
SEQ = 48  # > ORIGINAL_MAX and > every window below
ORIGINAL_MAX = 16
SMALL = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def published(name: str) -> dict:
    return json.loads((REFERENCE / name / "config.json").read_text())


def shrink(d: dict, **kw) -> dict:
    """A published config.json at small widths; RoPE scaling keeps its type with a small original length."""
    d = {**d, **SMALL, **kw}
    if "head_dim" in d:
        d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the published ids index the published vocabulary:
        v = d.get(k)                                             # the small one's last id stands in (issue 50)
        if v is not None:
            d[k] = [min(x, d["vocab_size"] - 1) for x in v] if isinstance(v, list) else min(v, d["vocab_size"] - 1)
    rs = d.get("rope_scaling")
    if isinstance(rs, dict) and "original_max_position_embeddings" in rs:
        d["rope_scaling"] = {**rs, "original_max_position_embeddings": ORIGINAL_MAX}
    return d


def hf_model(d: dict):
    """The HF model for a config dict, random weights with non-zero biases (seeded)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items() if k != "model_type"})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model


def _rope(kind: str, **kw) -> dict:
    return {"rope_type": kind, "rope_theta": 10000.0, **kw}


LONGROPE = dict(short_factor=[1.0 + 0.1 * i for i in range(8)], long_factor=[2.0 + 0.3 * i for i in range(8)],
                original_max_position_embeddings=ORIGINAL_MAX)
VARIANTS = {
    **{name: (lambda name=name: shrink(published(name))) for name in PUBLISHED},
    "llama-linear": lambda: shrink(published("llama-3.1-8b"), rope_scaling=_rope("linear", factor=4.0)),
    "llama-dynamic": lambda: shrink(published("llama-3.1-8b"), rope_scaling=_rope("dynamic", factor=4.0)),
    "llama-yarn": lambda: shrink(published("llama-3.1-8b"), rope_scaling=_rope(
        "yarn", factor=4.0, original_max_position_embeddings=ORIGINAL_MAX)),
    "llama-longrope": lambda: shrink(published("llama-3.1-8b"), rope_scaling=_rope("longrope", **LONGROPE)),
    "llama-biases": lambda: shrink(published("llama-3.1-8b"), attention_bias=True, mlp_bias=True),
    "mistral-window": lambda: shrink(published("mistral-7b-v0.3"), sliding_window=8),
    "qwen2-windows": lambda: shrink(published("qwen2.5-1.5b"), use_sliding_window=True, sliding_window=8,
                                    max_window_layers=1),
}


def _ids(t: int = SEQ):
    return torch.randint(0, 512, (2, t), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "swap"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_conversion_reproduces_the_hf_fp32_forward(variant, fuse):
    hf = hf_model(VARIANTS[variant]())
    conv = convert_model(copy.deepcopy(hf), backend="emulated", fuse=fuse)
    for t in (ORIGINAL_MAX - 4, SEQ):  # before and past the original context (longrope switches tables)
        off = check_equivalence(hf, conv, _ids(t))
        assert off.logits_rel_diff < 1e-4 and off.loss_abs_diff < 1e-4, (variant, t, off)
    on = check_equivalence(hf, conv, _ids(), fp8=True)
    assert torch.isfinite(torch.tensor(on.loss_converted)) and 0 < on.logits_rel_diff < 0.3, on
    sd = export_hf_state_dict(conv)  # exact: the weights as they went in
    ref = hf.state_dict()
    assert set(sd) == set(ref) and all(torch.equal(v, ref[k]) for k, v in sd.items())


def test_the_fused_blocks_take_what_the_config_says():
    """Spec-level facts, each of which the forward comparison above would catch if wrong."""
    from fp8lab.fp8.fused import spec_from_hf

    s = spec_from_hf(hf_model(VARIANTS["qwen2-windows"]()))
    assert (s.qkv_bias, s.proj_bias, s.mlp_bias, s.tied) == (True, False, False, True)
    assert s.windows == (None, 8, 8)  # layers from max_window_layers on slide
    assert spec_from_hf(hf_model(VARIANTS["mistral-7b-v0.3"]())).windows == (None, None, None)  # sliding_window: null
    assert spec_from_hf(hf_model(VARIANTS["mistral-window"]())).windows == (8, 8, 8)
    s = spec_from_hf(hf_model(VARIANTS["llama-3.2-1b"]()))
    assert s.rope_type == "llama3" and s.tied and s.softmax_scale == pytest.approx(16 ** -0.5)
    s = spec_from_hf(hf_model(VARIANTS["llama-yarn"]()))  # yarn's mscale, squared, in the softmax scale
    assert s.softmax_scale > 16 ** -0.5 * 1.05


def test_a_wrong_rope_or_window_would_be_seen():
    """The comparison has teeth: plain RoPE for a llama3 config, or no window for Mistral's, differ."""
    hf = hf_model(VARIANTS["llama-3.2-1b"]())
    conv = convert_model(copy.deepcopy(hf), backend="emulated", fuse=True)
    conv.__dict__["_rope_source"] = None  # rope_theta only, as before issue 27
    assert check_equivalence(hf, conv, _ids()).logits_rel_diff > 1e-3
    hf = hf_model(VARIANTS["mistral-window"]())
    conv = convert_model(copy.deepcopy(hf), backend="emulated", fuse=True)
    for b in conv.blocks:
        b.attn.window = None
    assert check_equivalence(hf, conv, _ids()).logits_rel_diff > 1e-3


def test_longrope_switches_tables_past_the_original_length():
    from fp8lab.fp8.fused import hf_rope

    r = hf_rope(hf_model(VARIANTS["llama-longrope"]()).config)
    assert not torch.equal(r.inv_freq(ORIGINAL_MAX), r.inv_freq(ORIGINAL_MAX + 1))
    assert torch.equal(r.inv_freq(4), r.inv_freq(ORIGINAL_MAX))


# ------------------------------------------------------------------------------- folders and refusals

def save(path, d: dict, weights: bool = True, **save_kw):
    path.mkdir(parents=True, exist_ok=True)
    if weights:
        hf_model(d).save_pretrained(str(path), **save_kw)
    else:
        (path / "config.json").write_text(json.dumps(d))
    return path


def test_a_sharded_folder_loads_with_its_weights(tmp_path):
    from fp8lab.model.models import build_model

    d = VARIANTS["qwen2.5-1.5b"]()
    src = save(tmp_path / "sharded", d, max_shard_size="100KB")
    assert (src / "model.safetensors.index.json").is_file() and len(list(src.glob("*.safetensors"))) > 1
    built = build_model(str(src))
    want = hf_model(d).state_dict()
    assert type(built).__name__ == "Qwen2ForCausalLM"
    assert all(torch.equal(v, want[k]) for k, v in built.state_dict().items())


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_config_and_weights_that_disagree_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from fp8lab.model.models import build_model

    d = VARIANTS["llama-3.2-1b"]()
    src = save(tmp_path / "shape", d)
    (src / "config.json").write_text(json.dumps({**json.loads((src / "config.json").read_text()),
                                                 "intermediate_size": 256}))
    # the folder's own checks (fp8lab.model.checks), when it is first read: before anything is built
    with pytest.raises(ValueError, match=r"weights tensor 'model.layers.0.mlp.gate_proj.weight' has shape \[128, 64\] "
                                         r"but config.json gives \[256, 64\]") as e:
        build_model(str(src))
    _one_line(e)
    src = save(tmp_path / "missing", d)
    sd = load_file(str(src / "model.safetensors"))
    sd.pop("model.layers.1.self_attn.k_proj.weight")
    save_file(sd, str(src / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"the weights lack tensor 'model.layers.1.self_attn.k_proj.weight'") as e:
        build_model(str(src))
    _one_line(e)


def test_unknown_rope_type_is_refused_on_both_paths(tmp_path):
    src = save(tmp_path / "r", shrink(published("llama-3.1-8b"), rope_scaling=_rope("wobbly", factor=2.0)), weights=False)
    for fuse in (True, False):
        with pytest.raises(ValueError, match=r"rope_type='wobbly' is not a RoPE type transformers implements; "
                                             r"allowed: default, linear, dynamic, yarn, longrope, llama3") as e:
            TrainConfig(model=str(src), precision="fp8", backend="emulated", fuse=fuse)
        _one_line(e)


def test_custom_code_is_refused_and_never_run(tmp_path):
    marker = tmp_path / "ran"
    d = {**VARIANTS["llama-3.2-1b"](), "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM",
                                                     "AutoConfig": "configuration_evil.EvilConfig"}}
    src = save(tmp_path / "evil", d, weights=False)
    for name in ("modeling_evil.py", "configuration_evil.py"):
        (src / name).write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    with pytest.raises(ValueError, match=r"auto_map \(custom modelling code: AutoConfig, AutoModelForCausalLM\); "
                                         r"fp8lab never runs a folder's code") as e:
        TrainConfig(model=str(src), precision="fp8", backend="emulated")
    _one_line(e)
    from fp8lab.model.models import build_model

    with pytest.raises(ValueError, match="auto_map"):
        build_model(str(src))
    assert not marker.exists()


@pytest.mark.parametrize("model_type, why", [
    ("gemma", r"embeddings scaled by sqrt\(hidden_size\)"),
    ("gemma2", r"logit soft-capping"),
    ("phi3", r"qkv_proj, gate_up_proj"),
    ("mixtral", r"mixture of experts"),
    ("qwen2_moe", r"mixture of experts .*shared expert"),
    ("qwen3", r"q_norm, k_norm"),
    ("falcon", None),
])
def test_other_families_are_refused_before_any_compute(model_type, why, tmp_path):
    src = save(tmp_path / model_type, {**SMALL, "model_type": model_type}, weights=False)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=f"model_type='{model_type}', which fp8lab does not support"
                                         f"{'; it differs by .*' + why if why else ''}.*supported: llama "
                                         r"\(LlamaForCausalLM.*mistral \(MistralForCausalLM.*qwen2 \(Qwen2ForCausalLM"
                                         r".*gpt_neo") as e:
        TrainConfig(model=str(src), precision="fp8", backend="emulated", output_dir=str(out))
    _one_line(e)
    assert not out.exists()
