"""LoRA (``--lora-rank``) end to end on CPU: a tiny Llama and a tiny Qwen2 folder written by ``save_pretrained``
fine-tune with peft's adapters on the converted (emulated FP8) layers, in BF16 and FP8; the base stays as the
folder had it, only the adapters train, and the exported adapter folder (real peft) and merged model (real
transformers) give the trained model's logits."""
from __future__ import annotations

import json

import pytest
import torch

from fp8lab.data import tokens as fdata
from fp8lab.plan import lora as lora_plan
from fp8lab.train.entry import TrainConfig, train

pytestmark = pytest.mark.slow  # short training runs with two exports each: 5 to 6 s each on the 2-core machine

RUN = dict(seq_len=32, micro_batch_size=2, grad_accum=1, compute_dtype="fp32", plot=False, progress="off",
           print_metrics=False, val_every=0, steps=3, lr=1e-2, warmup_steps=1, backend="emulated",  # --fuse auto
           lora_rank=4, lora_alpha=8.0, export_merged=True)


def tiny(kind: str):
    from transformers import LlamaConfig, Qwen2Config

    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=256)
    if kind == "llama":
        return LlamaConfig(**shape, tie_word_embeddings=False)
    return Qwen2Config(**shape, tie_word_embeddings=True)  # Q/K/V biases, tied head


def save_folder(path, cfg):
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(str(path))
    tok = PreTrainedTokenizerFast(tokenizer_file=str(fdata.shipped_tokenizer_path(512)), eos_token=fdata.EOS_TOKEN)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(str(path))
    return path


def logits(model, vocab: int):
    x = torch.randint(0, vocab, (2, 24), generator=torch.Generator().manual_seed(1))
    model.eval()
    with torch.no_grad():  # outside FP8 autocast: the trained weights as they are
        return model(x).logits.float()


@pytest.mark.parametrize("kind, precision, fuse", [("llama", "bf16", True), ("llama", "fp8", True),
                                                   ("qwen2", "fp8", True), ("llama", "fp8", "auto"),
                                                   ("llama", "fp8", False)])
def test_lora_trains_only_the_adapters_and_both_exports_give_the_trained_logits(kind, precision, fuse, prepared,
                                                                                tmp_path, capture_trained):
    from peft import PeftModel
    from peft.tuners.lora import LoraLayer
    from transformers import AutoModelForCausalLM

    from fp8lab.fp8.backends.emulated import EmuLinear
    from fp8lab.fp8.fused import FusedCausalLM
    from fp8lab.train import lora as flora

    cfg = tiny(kind)
    src = save_folder(tmp_path / kind, cfg)
    out = tmp_path / "run"
    s = train(TrainConfig(**RUN, precision=precision, fuse=fuse, model=str(src), data=str(prepared),
                          output_dir=str(out)))
    assert s["status"] == "completed" and s["steps"] == 3
    trained = capture_trained["inner"]

    if fuse is not False:  # auto too: fp8lab's adapters on the fused blocks' GEMMs (the emulator's FP8 twins of TE's)
        assert isinstance(trained, FusedCausalLM)
        assert sum(len(b.lora) for b in trained.blocks) == 7 * cfg.num_hidden_layers
    else:  # peft's LoRA wraps the emulator's FP8 layers (its default Linear layer around an EmuLinear base)
        wrapped = [m for m in trained.modules() if isinstance(m, LoraLayer)]
        assert len(wrapped) == 7 * cfg.num_hidden_layers
        assert all(isinstance(m.get_base_layer(), EmuLinear) for m in wrapped)
    # only the adapters train; the base is the folder's, bit for bit
    start = AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).state_dict()
    sd = trained.state_dict()
    base, _ = flora.split_state_dict(sd, trained)
    if cfg.tie_word_embeddings:
        base.setdefault("lm_head.weight", base["model.embed_tokens.weight"])
    assert set(base) == set(start) and all(torch.equal(base[k], start[k]) for k in start)
    assert [n for n, p in trained.named_parameters() if p.requires_grad] == \
        [n for n in dict(trained.named_parameters()) if ".lora_" in n]
    lora_b = [v for k, v in sd.items() if ".lora_B." in k]  # peft starts B at zero: trained, it moved
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)
    # the record: the options as they ran, and what was built; the count is the plan's
    rec = json.loads((out / "config.json").read_text())
    assert rec["lora_rank"] == 4 and rec["lora_targets"] == "all" and rec["export_merged"] is True
    mcfg = TrainConfig(**RUN, model=str(src)).model_config
    assert rec["built"]["lora_adapter_params"] == lora_plan.adapter_params(mcfg, 4, lora_plan.PROJECTIONS["llama"])
    assert rec["built"]["lora_frozen_params"] == sum(v.numel() for k, v in start.items()
                                                    if not (cfg.tie_word_embeddings and k == "lm_head.weight"))

    want = logits(trained, cfg.vocab_size)
    # the adapter folder: peft's, on the folder's own base model
    adapter_dir = out / "model"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {p.name for p in
                                                                                      adapter_dir.iterdir()}
    assert not (adapter_dir / "config.json").exists()
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32),
                                           str(adapter_dir))
    torch.testing.assert_close(logits(peft_model, cfg.vocab_size), want, rtol=1e-4, atol=1e-4)
    # the merged model: a plain transformers folder of the original class
    merged = AutoModelForCausalLM.from_pretrained(str(adapter_dir / "merged"), dtype=torch.float32)
    assert type(merged).__name__ == type(cfg).__name__.replace("Config", "ForCausalLM")
    assert not any(".lora_" in k or "base_layer" in k for k in merged.state_dict())
    torch.testing.assert_close(logits(merged, cfg.vocab_size), want, rtol=1e-4, atol=1e-4)
    assert (adapter_dir / "merged" / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    # both chat with the template the run was trained on (save_pretrained keeps it in chat_template.jinja)
    from transformers import AutoTokenizer

    template = AutoTokenizer.from_pretrained(str(src)).chat_template
    assert template and all(AutoTokenizer.from_pretrained(str(d)).chat_template == template
                            for d in (adapter_dir, adapter_dir / "merged"))


def test_a_finished_lora_run_is_kept_and_its_folder_reused(prepared, tmp_path):
    """The same command again finds the run complete (its adapter folder exported, no config.json there) and keeps
    it as it is."""
    src = save_folder(tmp_path / "l", tiny("qwen2"))
    kw = dict(**{**RUN, "export_merged": False}, precision="bf16", model=str(src), data=str(prepared),
              output_dir=str(tmp_path / "run"))
    first = train(TrainConfig(**kw))
    adapter = (tmp_path / "run" / "model" / "adapter_model.safetensors").read_bytes()
    again = train(TrainConfig(**kw))
    assert again == first and (tmp_path / "run" / "model" / "adapter_model.safetensors").read_bytes() == adapter
