"""A tiny pretrained-model folder made here: a small Llama or Qwen2 written by ``save_pretrained`` beside its own
tokenizer (a byte-level BPE trained on the shipped instruction set) and its family's chat template.

Nothing can be downloaded on the machines fp8lab is tested on, yet fine-tuning is about a model that brings its own
tokenizer and template: this folder has both, in the files a real checkpoint has (``config.json``,
``model.safetensors``, ``tokenizer.json``, ``tokenizer_config.json``), so ``--model`` treats it exactly as a
downloaded Llama-3.x or Qwen2.5 folder. Its weights are random (seeded): it shows the mechanics of a fine-tune, not
what a pretrained model gains from one. The special tokens and templates follow each family's public format.
"""
from __future__ import annotations

from pathlib import Path

from fp8lab.data import sft

LLAMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
                  "{{ m['content'] }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant"
                  "<|end_header_id|>\n\n{% endif %}")
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# family -> (special tokens, chat template, eos, bos)
FAMILIES = {
    "llama": (["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"], LLAMA_TEMPLATE,
              "<|eot_id|>", "<|begin_of_text|>"),
    "qwen2": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], QWEN_TEMPLATE, "<|im_end|>", None),
}
TOKENIZER_VOCAB = 400  # tokens the BPE learns from the shipped set (its specials included)
SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=512)


def _check_family(family: str) -> None:
    if family not in FAMILIES:
        raise ValueError(f"family={family!r} is invalid; allowed: {', '.join(FAMILIES)}")


def tokenizer(family: str = "llama", with_template: bool = True):
    """A ``PreTrainedTokenizerFast`` of the family's special tokens and chat template (``with_template=False``: none),
    its byte-level BPE trained on the shipped instruction set (fp8lab.data.sft.shipped)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    _check_family(family)
    specials, template, eos, bos = FAMILIES[family]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sft.shipped().read_text(encoding="utf-8").splitlines(), trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, bos_token=bos,
                                   chat_template=template if with_template else None)


def build(path: str | Path, family: str = "llama", vocab_size: int = 512, with_template: bool = True,
          seed: int = 0) -> Path:
    """Write the folder at ``path`` (created; files of these names there are replaced) and return it: the model
    (:data:`SHAPE`, ``vocab_size`` rows of embedding, at least the tokenizer's) in fp32, its tokenizer and template."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    _check_family(family)
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size={vocab_size!r} is invalid; allowed: a positive integer (at least "
                         f"{TOKENIZER_VOCAB}, the tokenizer's size, for a folder that trains)")
    torch.manual_seed(seed)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=vocab_size, **SHAPE, num_key_value_heads=4,
                                             tie_word_embeddings=False))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(vocab_size=vocab_size, **SHAPE, num_key_value_heads=2,
                                             tie_word_embeddings=True))
    path = Path(path)
    model.save_pretrained(str(path))
    tokenizer(family, with_template).save_pretrained(str(path))
    return path
