"""Bring your own model on an FP8 GPU (skipped without one): user-shaped checkpoints saved by
``save_pretrained`` train a few dozen real FP8 steps (Transformer Engine, fused) from a local folder,
export back to their own HF class, reload with ``from_pretrained`` and give the trained converted
model's logits to bf16 noise (issue 18).

Shapes: a Llama-3-8B layer shape at reduced depth (GQA 32:8, vocab 128,256, rope_theta 5e5, 3 layers),
GPT-Neo-2.7B (hidden 2560, 20 heads, window 256, 32 layers), and the published Llama-3.2-1B (llama3 RoPE
scaling, tied) and Qwen2.5-1.5B (Q/K/V biases, tied) configs (issue 27). Weights are random (nothing is
downloaded); the data are the shipped corpus tokenized with the 32,000-token tokenizer (<= both vocabularies).
"""
from __future__ import annotations

import json

import pytest
from gpu_skips import te_or_skip as _te_or_skip
import torch

from fp8lab.data import tokens as fdata
from fp8lab.records import metrics as fmetrics
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.gpu

STEPS = 30




@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    fdata.prepare_data(None, out, None, vocab_size=32000)
    return out


def llama3_style():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=3,
                       num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                       rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000,
                       eos_token_id=128001)


def gptneo_27b():
    from transformers import GPTNeoConfig

    return GPTNeoConfig(vocab_size=50257, hidden_size=2560, num_layers=32, num_heads=20,
                        attention_types=[[["global", "local"], 16]], max_position_embeddings=2048, window_size=256,
                        embed_dropout=0.0, resid_dropout=0.0, attention_dropout=0.0)


def _published(name: str):
    """A published config (data/reference/configs, issue 27) as its transformers config object."""
    from transformers import AutoConfig

    from fp8lab.core.paths import REPO_ROOT

    d = json.loads((REPO_ROOT / "data" / "reference" / "configs" / name / "config.json").read_text())
    return AutoConfig.for_model(d.pop("model_type"), **d)


def llama32_1b():  # Llama 3.1+ RoPE scaling (rope_type llama3), tied embeddings, 16 layers
    return _published("llama-3.2-1b")


def qwen25_15b():  # Qwen2: Q/K/V biases, tied embeddings, 28 layers
    return _published("qwen2.5-1.5b")


@pytest.mark.parametrize("make", [llama3_style, gptneo_27b, llama32_1b, qwen25_15b],
                         ids=["llama3-style-3-layers", "gptneo-2.7b", "llama-3.2-1b", "qwen2.5-1.5b"])
def test_user_folder_trains_in_fp8_exports_and_reloads(make, prepared, tmp_path, capture_trained, gpu_record):
    _te_or_skip()
    from transformers import AutoModelForCausalLM

    cfg = make()
    src = tmp_path / "mine"
    torch.manual_seed(0)
    with torch.device("cuda"):
        AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(str(src))
    seen = capture_trained
    out = tmp_path / "run"
    s = train(TrainConfig(model=str(src), precision="fp8", backend="te", fuse=True, steps=STEPS, seq_len=512,
                          micro_batch_size=2, grad_accum=1, lr=3e-4, warmup_steps=5, val_every=0, progress="off",
                          print_metrics=False, plot=False, device="cuda", checkpoint_every=-1,
                          data=str(prepared), output_dir=str(out)))
    assert s["status"] == "completed" and s["steps"] == STEPS and s["nonfinite_steps"] == 0
    recs = fmetrics.read_metrics(out / "metrics.jsonl")
    assert recs[-1]["loss"] < recs[0]["loss"]
    rec = json.loads((out / "config.json").read_text())
    assert rec["conversion"]["fused"] is True and rec["plan"]["backend"] == "te"
    assert rec["model_source"]["params_built"] == rec["model_source"]["params_from_config"]

    reloaded = AutoModelForCausalLM.from_pretrained(str(out / "model"), dtype=torch.bfloat16).cuda().eval()
    from fp8lab.model.families import SUPPORTED

    assert type(reloaded).__name__ == SUPPORTED[cfg.model_type].hf_class
    trained = seen["inner"].eval()
    x = torch.randint(0, 32000, (2, 256), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        want = trained(x).logits.float()  # FP8 off: the trained weights in bf16
        got = reloaded(x).logits.float()
    rel = ((got - want).norm() / want.norm()).item()
    assert rel < 2e-2, f"exported model's logits differ from the trained converted model's by {rel:.3g} (relative)"
    gpu_record(model=make.__name__, params=rec["model_source"]["params_built"], steps=STEPS,
               cuda_graphs_active=rec["plan"]["cuda_graphs"], logits_rel_diff=rel, first_loss=recs[0]["loss"],
               last_loss=recs[-1]["loss"], tokens_per_sec_per_gpu_median=s["tokens_per_sec_per_gpu_median"])
