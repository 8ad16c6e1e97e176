"""A model folder's own tokenizer and instruction data (``--task sft``) on CPU, with real transformers classes: a tiny
Llama and a tiny Qwen2 saved by ``save_pretrained``, each beside its own tokenizer (trained here with ``tokenizers``,
wrapped in ``PreTrainedTokenizerFast``, each with its own chat template)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fp8lab.data import model_tokenizer, run_data, sft, tiny_model
from fp8lab.data import tokens as fdata
from fp8lab.plan.fused_loss import IGNORE_INDEX
from fp8lab.train import entry as ftrain
from fp8lab.train import fused_loss

FAMILIES = tiny_model.FAMILIES  # each family's special tokens and chat template
RECORDS = [json.loads(line) for line in sft.shipped().read_text().splitlines()[:40]]
tiny_tokenizer = tiny_model.tokenizer  # a family's tokenizer, trained on the shipped set
model_folder = tiny_model.build  # a tiny folder of the family: weights, tokenizer, template


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {f: model_folder(root / f, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def records_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sft") / "x.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return path


def prepared_sft(folder, tmp_path):
    out = tmp_path / "prepared-sft"
    sft.prepare(write_jsonl(tmp_path / "r.jsonl", RECORDS[:4]), out, model_tokenizer.load(str(folder)),
                tokenizer_source=model_tokenizer.source(str(folder)))
    return out


def write_jsonl(path, lines):
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


# ------------------------------------------------------------------------------------ the model's own tokenizer

def test_a_folder_with_tokenizer_files_tokenizes_the_data_with_it(folders, tmp_path):
    from transformers import AutoTokenizer

    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(r["prompt"] if "prompt" in r else r["messages"][-2]["content"] for r in RECORDS))
    theirs = AutoTokenizer.from_pretrained(str(folders["qwen2"]))
    out = run_data.ensure_prepared(str(text), tmp_path / "cache", 512, model=str(folders["qwen2"]))
    m = fdata.read_manifest(out)
    assert m["tokenizer_source"]["kind"] == "model" and m["tokenizer_source"]["name"] == "qwen2"
    assert m["vocab_size"] == len(theirs) == 400
    docs = list(fdata.read_documents([text]))
    want = []
    for i, d in enumerate(docs):
        if i % 20 != 19:  # every 20th document is the validation split's
            want += theirs(d, add_special_tokens=False)["input_ids"] + [theirs.eos_token_id]
    got = fdata.TokenShards(out, "train").read(0, len(want))
    assert got.tolist() == want
    # fp8lab's BPE on the same text is other data: another identity (a checkpoint's fingerprint), never the cache
    bpe = run_data.ensure_prepared(str(text), tmp_path / "bpe", 512, model="llama-tiny")
    mb = fdata.read_manifest(bpe)
    assert mb["tokenizer_source"] == fdata.BPE_SOURCE and fdata.identity(mb) != fdata.identity(m)
    assert run_data.ensure_prepared(str(text), tmp_path / "cache", 512, model="llama-tiny") == tmp_path / "cache"
    assert fdata.read_manifest(tmp_path / "cache")["tokenizer_source"] == fdata.BPE_SOURCE  # re-prepared, not reused
    assert "the model's own tokenizer (qwen2" in run_data.notes(out, m, 64)[0]


def test_the_chat_template_is_part_of_the_tokenizer_s_identity(folders, tmp_path):
    """A changed template renders other tokens: a token cache made with the old one is never reused."""
    import shutil

    folder = shutil.copytree(folders["llama"], tmp_path / "llama")
    template = folder / "chat_template.jinja"
    before = model_tokenizer.source(str(folder))
    assert template.is_file() and "chat_template.jinja" in before["files"]
    template.write_text(template.read_text() + "{# edited #}")
    assert model_tokenizer.source(str(folder))["sha256"] != before["sha256"]
    from fp8lab.model.user import TOKENIZER_FILES, copy_tokenizer

    out = tmp_path / "export"
    out.mkdir()
    assert "chat_template.jinja" in copy_tokenizer(str(folder), out) and (out / "chat_template.jinja").is_file()
    for name in TOKENIZER_FILES:  # a template alone is no tokenizer: nothing is copied, the export ships the data's
        (folder / name).unlink(missing_ok=True)
    assert model_tokenizer.folder(str(folder)) is None and copy_tokenizer(str(folder), tmp_path) == []


def test_trained_weights_without_a_tokenizer_are_named_in_the_run_s_lines(folders, tmp_path):
    """fp8lab's BPE then tokenizes the data: its ids mean nothing to the weights, which the run says."""
    import shutil

    from fp8lab.model.user import TOKENIZER_FOLDER_FILES

    folder = shutil.copytree(folders["llama"], tmp_path / "weights-only")
    for name in TOKENIZER_FOLDER_FILES:
        (folder / name).unlink(missing_ok=True)
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(r["prompt"] if "prompt" in r else r["messages"][-2]["content"] for r in RECORDS))
    out = run_data.ensure_prepared(str(text), tmp_path / "cache", 512, model=str(folder))
    m = fdata.read_manifest(out)
    assert m["tokenizer_source"] == fdata.BPE_SOURCE
    said = run_data.notes(out, m, 64, str(folder))
    assert any("holds trained weights but no tokenizer files" in line for line in said)
    assert not any("no tokenizer files" in line for line in run_data.notes(out, m, 64, "llama-tiny"))  # a shape
    assert not any("no tokenizer files" in line for line in run_data.notes(out, m, 64, str(folders["llama"])))


def test_a_tokenizer_larger_than_the_embedding_is_refused(tmp_path):
    folder = model_folder(tmp_path / "small", "llama", vocab_size=300)
    with pytest.raises(ValueError, match=r"its tokenizer has 400 tokens \(ids 0..399\) but its config.json has "
                                         r"vocab_size 300.*vocab_size >= 400"):
        run_data.check_source(None, "pretrain", str(folder), 300)
    code = ftrain.main(["--model", str(folder), "--steps", "1", "--output-dir", str(tmp_path / "run")])
    assert code == 2 and not (tmp_path / "run").exists()


def test_named_shapes_and_folders_without_tokenizer_keep_fp8labs_bpe(tmp_path):
    from transformers import LlamaConfig

    LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4).save_pretrained(str(tmp_path / "bare"))
    assert model_tokenizer.folder("llama-tiny") is None and model_tokenizer.folder(str(tmp_path / "bare")) is None
    assert model_tokenizer.source(str(tmp_path / "bare")) == fdata.BPE_SOURCE
    # --task sft without --data: the shipped set, fp8lab's BPE and the plain template
    out = run_data.ensure_prepared(None, tmp_path / "cache", 512, model="llama-tiny", task="sft")
    m = fdata.read_manifest(out)
    assert m["task"] == "sft" and m["template"]["kind"] == "plain" and m["tokenizer_source"] == fdata.BPE_SOURCE
    assert m["source"]["files"] == ["kjv-qa.jsonl"] and m["documents"] == 240 and m["splits"]["val"]["documents"] == 12


# ------------------------------------------------------------------------------------ instruction data

@pytest.mark.parametrize("family", [*FAMILIES, "plain"])
def test_only_the_answers_carry_loss(family, tmp_path):
    tok = tiny_tokenizer("qwen2", with_template=False) if family == "plain" else tiny_tokenizer(family)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Which verse follows?"},
            {"role": "assistant", "content": "And there was light."}, {"role": "user", "content": "And then?"},
            {"role": "assistant", "content": "And God saw the light."}]
    ids, mask = sft.render(tok, msgs)
    full = tok.apply_chat_template(msgs, tokenize=False, chat_template=sft.template_of(tok)[0])
    assert ids == tok(full, add_special_tokens=False)["input_ids"]  # the tokenizer's own ids
    end = {"llama": "<|eot_id|>", "qwen2": "<|im_end|>", "plain": "<|im_end|>"}[family]
    answers = tok.decode([i for i, m in zip(ids, mask) if m])
    assert answers == f"And there was light.{end}And God saw the light.{end}"
    assert sft.template_of(tok)[1] == ("plain" if family == "plain" else "chat_template")
    if family == "plain":
        assert full.startswith("### System:\nBe brief.\n\n### User:\nWhich verse follows?\n\n### Assistant:\n")


def test_packed_rows_put_the_loss_on_answer_tokens_only(folders, records_file, tmp_path):
    tok = model_tokenizer.load(str(folders["llama"]))
    out = tmp_path / "prep"
    m = sft.prepare(records_file, out, tok, tokenizer_source=model_tokenizer.source(str(folders["llama"])),
                    val_fraction=0.1)
    assert m["task"] == "sft" and m["splits"]["val"]["documents"] == 4 and m["splits"]["train"]["documents"] == 36
    assert run_data.ensure_prepared(str(records_file), out, 512, model=str(folders["llama"]), task="sft",
                                    val_fraction=0.1) == out
    loader = run_data.loader(out, "train", 192, 2, seed=3)
    assert isinstance(loader, sft.SFTLoader)
    x, y = loader.next_batch()
    assert x.shape == y.shape == (2, 192)
    # two ranks read exactly what one process reads with their batch, and the position is all a resume needs
    halves = [run_data.loader(out, "train", 192, 1, seed=3, rank=r, world_size=2).next_batch() for r in (0, 1)]
    assert torch.equal(torch.cat([h[0] for h in halves]), x) and torch.equal(torch.cat([h[1] for h in halves]), y)
    again = run_data.loader(out, "train", 192, 2, seed=3)
    again.load_state_dict(loader.state_dict())
    assert torch.equal(again.next_batch()[1], loader.next_batch()[1])
    loader = run_data.loader(out, "train", 192, 2, seed=3)
    assert torch.equal(loader.next_batch()[0], x)
    # every example's tokens, mask from the render: the row's labels are the next token on answers, -100 elsewhere
    lengths = [n for _, n in json.loads((out / "train_examples.json").read_text())]
    assert sum(len(r) for r in loader.rows) == len(lengths) == 36
    held = {n for n, _ in json.loads((out / "val_examples.json").read_text())}
    assert held == {i + 1 for i in np.flatnonzero(sft.split_of(40, 0.1))}  # seeded, whatever the run's seed
    row = loader.rows[loader._window(0)]
    first = [m for n, m in sft.records([records_file]) if n not in held][row[0]]
    ids, mask = sft.render(tok, first)
    n = len(ids) - 1
    assert x[0, :n].tolist() == ids[:-1]
    assert y[0, :n].tolist() == [t if k else IGNORE_INDEX for t, k in zip(ids[1:], mask[1:])]
    # the loss of random logits: the trainer's (cross-entropy, ignore_index) and the fused loss's equal the mean over
    # answer tokens computed by hand
    torch.manual_seed(0)
    h, w = torch.randn(2, 192, 16), torch.randn(400, 16)
    logits = h.double() @ w.double().T
    keep = y != IGNORE_INDEX
    by_hand = -(logits.log_softmax(-1).gather(-1, y.clamp(min=0)[..., None])[..., 0])[keep].mean()
    assert 0 < keep.sum() < keep.numel() / 2
    torch.testing.assert_close(F.cross_entropy(logits.reshape(-1, 400), y.reshape(-1)), by_hand)
    fused = fused_loss.linear_cross_entropy(h, w, y, chunk=64, kernel="eager")
    torch.testing.assert_close(fused.double(), by_hand, rtol=1e-5, atol=1e-5)


BAD = [  # (the record, what its one line says after "record 2 (line 2)")
    ('{"messages": [', " is not JSON (Expecting value at column 15)"),
    ('[1, 2]', " is a list, not a JSON object"),
    ({"prompt": "Hi"}, ": field response is missing"),
    ({"prompt": "Hi", "response": "  "}, ": field response is empty"),
    ({"prompt": "Hi", "response": 3}, ": field response is a number, not a string"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "bot", "content": "Yo"}]},
     ": field messages[1].role is 'bot'; allowed: system | user | assistant"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ""}]},
     ": field messages[1].content is empty"),
    ({"messages": [{"role": "user", "content": "Hi"}]}, ": field messages has no assistant turn"),
    ({"messages": [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Yo"}]},
     ": field messages[0] is an assistant turn before any user turn"),
]


@pytest.mark.parametrize("line, said", BAD)
def test_bad_records_are_named_in_one_line(line, said, tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [RECORDS[0], line, RECORDS[1]])
    with pytest.raises(ValueError) as err:
        sft.check_source(str(path))
    assert str(err.value).startswith("--data: file 'bad.jsonl' record 2 (line 2)" + said)
    assert "\n" not in str(err.value)


def test_bad_data_stops_the_run_before_any_compute(folders, tmp_path, capsys):
    bad = write_jsonl(tmp_path / "bad.jsonl", [RECORDS[0], {"prompt": "Hi", "response": ""}, RECORDS[1]])
    base = ["--model", str(folders["qwen2"]), "--task", "sft", "--steps", "1", "--progress", "off"]
    assert ftrain.main([*base, "--data", str(bad), "--output-dir", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "record 2 (line 2): field response is empty" in err and not (tmp_path / "a").exists()
    # an example longer than a sequence: named by its record, before the model is built
    short = {"prompt": "Hi", "response": "And there was light."}
    long = write_jsonl(tmp_path / "long.jsonl", [short, {"prompt": "Hi", "response": "And " * 200}, short, short])
    assert ftrain.main([*base, "--data", str(long), "--seq-len", "128", "--output-dir", str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert "record 2 of 'long.jsonl' is" in err and "longer than one sequence of --seq-len 128" in err
    assert not (tmp_path / "b").exists()
    # pretraining tokens are not instruction data, nor the other way round
    fdata.prepare_data(write_jsonl(tmp_path / "t.jsonl", [{"text": f"text {i}"} for i in range(40)]), tmp_path / "p",
                       None, vocab_size=512)
    with pytest.raises(ValueError, match="allowed with --task sft: a .jsonl file"):
        sft.check_source(str(tmp_path / "p"))
    with pytest.raises(ValueError, match="holds tokens prepared for --task sft; allowed: --task sft"):
        run_data.check_source(str(prepared_sft(folders["qwen2"], tmp_path)), "pretrain", None, 512)
    with pytest.raises(ValueError, match="is not JSON lines; with --task sft allowed: .jsonl files"):
        sft.check_source(str(write_jsonl(tmp_path / "t.txt", ["plain text"])))
    with pytest.raises(ValueError, match="--data='hf:x' is invalid; allowed: with --task sft"):
        ftrain.TrainConfig(task="sft", data="hf:x")


def test_prepare_data_takes_the_model_and_the_task(folders, records_file, tmp_path, capsys):
    out = tmp_path / "prep"
    assert run_data.main([str(out), "--source", str(records_file), "--model", str(folders["qwen2"]),
                          "--task", "sft"]) == 0
    m = fdata.read_manifest(out)
    assert m["task"] == "sft" and m["tokenizer_source"]["name"] == "qwen2" and m["template"]["kind"] == "chat_template"
    text = tmp_path / "t.txt"
    text.write_text("\n\n".join(f"Verse {i}: and it was so." for i in range(40)))
    assert run_data.main([str(tmp_path / "pre"), "--source", str(text), "--model", str(folders["llama"])]) == 0
    m = fdata.read_manifest(tmp_path / "pre")
    assert m["task"] == "pretrain" and m["tokenizer_source"]["name"] == "llama" and m["vocab_size"] == 400
    assert run_data.main([str(tmp_path / "x"), "--model", "llama-tiny"]) == 2
    assert "--model='llama-tiny' is not a model folder with tokenizer files" in capsys.readouterr().err


def test_the_shipped_instruction_set_is_built_from_the_corpus():
    shipped = [json.loads(line) for line in sft.shipped().read_text().splitlines()]
    assert shipped == sft.build_kjv_instructions()
    assert len(shipped) == 240 and {"messages", "prompt"} <= {k for r in shipped for k in r}
    assert sft.check_source(None) == 240


# ------------------------------------------------------------------------------------ fine-tuning runs

def _sft_run(folder, data, out, *extra):
    return ftrain.main(["--model", str(folder), "--task", "sft", "--data", str(data), "--seq-len", "192",
                        "--micro-batch-size", "1", "--grad-accum", "1", "--steps", "2", "--val-batches", "1",
                        "--progress", "off", "--plot", "False", "--print-metrics", "False",
                        "--output-dir", str(out), *extra])


@pytest.mark.slow
@pytest.mark.parametrize("family, precision", [("llama", "fp8"), ("qwen2", "fp8"), ("llama", "bf16")])
def test_a_model_folder_fine_tunes_on_instruction_data(family, precision, folders, records_file, tmp_path, capsys):
    out = tmp_path / "run"
    extra = ["--precision", "fp8", "--backend", "emulated"] if precision == "fp8" else ["--precision", "bf16"]
    assert _sft_run(folders[family], records_file, out, *extra) == 0
    said = capsys.readouterr().out
    assert f"the model's own tokenizer ({family}" in said and "without a per-example attention mask" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and math.isfinite(summary["val_loss"])
    rec = json.loads((out / "config.json").read_text())
    assert rec["task"] == "sft" and rec["data_manifest"]["task"] == "sft"
    assert rec["data_manifest"]["tokenizer_source"]["name"] == family
    # the export ships the folder's tokenizer: the one the data were tokenized with
    assert (out / "model" / "tokenizer.json").read_bytes() == (folders[family] / "tokenizer.json").read_bytes()
