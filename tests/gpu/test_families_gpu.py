"""The families people bring (issue 27) at real widths on an FP8 GPU (skipped without one): the published
configs of Llama-3.2-1B, Llama-3.1-8B, Qwen2.5-1.5B and Mistral-7B-v0.3 (``data/reference/configs``)
with two decoder layers, random weights, converted by Transformer Engine (fused and swapped). As the Llama and
GPT-Neo tests in ``test_convert_gpu.py``: the bf16 conversion is at least as close to an fp32 forward of
the same weights as HF's own bf16 forward; FP8 on gives finite, bounded logits and gradients; the export
is exact. Extra cases put the sequence past a small ``original_max_position_embeddings`` and a window
shorter than the sequence at real widths."""
from __future__ import annotations

import copy
import json

import pytest
import torch

from fp8lab.fp8.backends import available_backends
from fp8lab.fp8.convert import autocast, check_equivalence, convert_model, export_hf_state_dict
from fp8lab.core.paths import REPO_ROOT

pytestmark = pytest.mark.gpu

CONFIGS = REPO_ROOT / "data" / "reference" / "configs"
SEQ = 1024
CASES = {
    "llama-3.2-1b": {},
    "llama-3.1-8b": {},
    "qwen2.5-1.5b": {},
    "mistral-7b-v0.3": {},
    # past the original context: llama3 scaling with original_max_position_embeddings 256 < SEQ
    "llama-3.2-1b-orig256": {"rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 256}},
    "mistral-7b-v0.3-window256": {"sliding_window": 256},
    "qwen2.5-1.5b-window256": {"use_sliding_window": True, "sliding_window": 256, "max_window_layers": 1},
}


def _need_te():
    reason = available_backends()["te"]
    if reason is not None:
        pytest.skip(f"te: {reason}")


def _model(case: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    base = case.split("-orig")[0].split("-window")[0]
    d = {**json.loads((CONFIGS / base / "config.json").read_text()), "num_hidden_layers": 2, **CASES[case]}
    cfg = AutoConfig.for_model(d.pop("model_type"), **d)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    with torch.no_grad():  # Qwen2's Q/K/V biases: non-zero, as a trained checkpoint's
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "swap"])
@pytest.mark.parametrize("case", list(CASES))
def test_family_matches_fp32_at_real_widths(case, fuse, gpu_record):
    _need_te()
    ref = _model(case)
    conv = convert_model(copy.deepcopy(ref), backend="te", fuse=fuse)
    sd = export_hf_state_dict(conv)
    assert set(sd) == set(ref.state_dict()) and all(torch.equal(v, ref.state_dict()[k]) for k, v in sd.items())
    g = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, min(ref.config.vocab_size, 32000), (2, SEQ), device="cuda", generator=g)
    rep = check_equivalence(ref, conv, ids, per_layer=True, fp32_reference=True)
    t = rep.fp32
    on = check_equivalence(ref, conv, ids, fp8=True)
    gpu_record(case=case, conversion="fused" if fuse else "swap", seq_len=SEQ, layers=2,
               windows=list(conv.spec.windows) if fuse else None, rope_type=conv.spec.rope_type if fuse else None,
               converted_vs_hf_bf16=rep.logits_rel_diff, hf_bf16_vs_fp32=t.reference_logits_rel_diff,
               converted_vs_fp32=t.converted_logits_rel_diff, fp8_vs_hf_bf16=on.logits_rel_diff)
    assert 0 < t.reference_logits_rel_diff < 0.5
    if fuse:  # RoPE angles in fp32 from transformers' frequencies: no further from the truth than HF bf16
        assert t.converted_at_least_as_close, rep
    else:  # HF's attention and RoPE with TE's GEMMs: HF's bf16 forward within rounding
        assert t.converted_logits_rel_diff <= 1.05 * t.reference_logits_rel_diff, rep
    assert t.converted_loss_abs_diff <= t.reference_loss_abs_diff + 2e-2, rep
    assert 0 < on.logits_rel_diff < 0.3 and on.loss_abs_diff < 0.1, on
    conv.train()
    with autocast("te"):
        loss = conv(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss) and all(torch.isfinite(p.grad).all() for p in conv.parameters() if p.grad is not None)
