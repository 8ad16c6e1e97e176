"""Bad instruction data (``--task sft``) is refused in one line naming the option, the file, the record and the field,
with what is allowed, before a model is built: text that is not UTF-8, damaged archives, records Python's json or the
tokenizer cannot take, ambiguous or empty turns, chat templates that refuse a record, and damaged prepared folders."""
from __future__ import annotations

import gzip
import json
import shutil

import pytest
from transformers import LlamaConfig

from fp8lab.data import model_tokenizer, run_data, sft, tiny_model
from fp8lab.train import entry as ftrain

GOOD = [{"prompt": f"Question {i}?", "response": f"Answer {i}."} for i in range(6)]
LINES = [json.dumps(r) for r in GOOD]
ONE_FORM = "allowed: one form per record"
PROMPT = "allowed: a non-empty prompt (the user turn the answer follows)"
PREPARED = "allowed: a folder written by fp8lab prepare-data --task sft (prepare it again)"
# a template that refuses a system turn, as Mistral's and Gemma's do
REFUSES_SYSTEM = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                  "supported') }}{% endif %}[{{ m['role'] }}] {{ m['content'] }}</s>{% endfor %}"
                  "{% if add_generation_prompt %}[assistant] {% endif %}")
# its generation prompt is not how it renders an assistant turn: the answer's start cannot be found
NOT_APPENDING = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                 "{% if add_generation_prompt %}<bot>{% endif %}")


def _jsonl(name, lines):
    return lambda d: (d / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _bytes(name, data):
    return lambda d: (d / name).write_bytes(data)


def _truncated_gz(d):
    raw = gzip.compress("".join(line + "\n" for line in LINES * 20).encode())
    (d / "cut.jsonl.gz").write_bytes(raw[:len(raw) // 2])


LATIN1 = ("\n".join(LINES[:3]) + "\n").encode() + b'{"prompt": "caf\xe9?", "response": "x"}\n'
BOTH = json.dumps({"messages": [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}],
                   "prompt": "p", "response": "r"})
EMPTY_USER = json.dumps({"messages": [{"role": "user", "content": " "}, {"role": "assistant", "content": "x"}]})

BAD = [  # (make the file in a folder, its name, what the one line says)
    (_bytes("latin1.jsonl", LATIN1), "latin1.jsonl",
     "--data: file 'latin1.jsonl' is not UTF-8 text (byte 0xe9 on line 4); allowed: UTF-8 text (convert it first, "
     "e.g. iconv -f latin1 -t utf-8)"),
    (_bytes("utf16.jsonl", "\n".join(LINES).encode("utf-16")), "utf16.jsonl",
     "--data: file 'utf16.jsonl' is not UTF-8 text (byte 0xff on line 1, a UTF-16 byte-order mark); allowed: UTF-8 "
     "text (convert it first, e.g. iconv -f utf-16 -t utf-8)"),
    (_bytes("junk.jsonl.gz", b"this is not gzip\n" * 10), "junk.jsonl.gz",
     "--data: file 'junk.jsonl.gz' is not a readable .gz archive (Not a gzipped file (b'th')); allowed: .jsonl files, "
     "optionally compressed with xz or gzip"),
    (_truncated_gz, "cut.jsonl.gz",
     "--data: file 'cut.jsonl.gz' is not a readable .gz archive (Compressed file ended before the end-of-stream marker "
     "was reached); allowed: .jsonl files"),
    (_jsonl("lone.jsonl", [LINES[0], '{"prompt": "a\\ud800", "response": "b"}', LINES[1]]), "lone.jsonl",
     "--data: file 'lone.jsonl' record 2 (line 2): field prompt is not valid Unicode text (a lone surrogate, \\ud800 "
     "at character 1); allowed: valid Unicode text"),
    (_jsonl("deep.jsonl", [LINES[0], "[" * 100_000 + "]" * 100_000, LINES[1]]), "deep.jsonl",
     "--data: file 'deep.jsonl' record 2 (line 2) is JSON that Python's json cannot read (lists or objects nested too "
     "deeply); allowed: {\"messages\""),
    (_jsonl("both.jsonl", [LINES[0], BOTH, LINES[1]]), "both.jsonl",
     f"--data: file 'both.jsonl' record 2 (line 2): fields messages and prompt / response are both given (one form "
     f"would be dropped unseen); {ONE_FORM}"),
    (_jsonl("noprompt.jsonl", [LINES[0], '{"prompt": "", "response": "x"}', LINES[1]]), "noprompt.jsonl",
     f"--data: file 'noprompt.jsonl' record 2 (line 2): field prompt is empty; {PROMPT}"),
    (_jsonl("nouser.jsonl", [LINES[0], EMPTY_USER, LINES[1]]), "nouser.jsonl",
     f"--data: file 'nouser.jsonl' record 2 (line 2): field messages[0].content is empty; {PROMPT}"),
]


def _train(*argv):
    return ftrain.main(["--task", "sft", "--steps", "2", "--device", "cpu", "--seq-len", "256", "--progress", "off",
                        *argv])


def _one_line(capsys, prog="fp8lab train"):
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"{prog}: error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("make, name, said", BAD, ids=[n for _, n, _ in BAD])
def test_bad_records_stop_the_run_in_one_line(make, name, said, tmp_path, capsys):
    make(tmp_path)
    out = tmp_path / "run"
    assert _train("--model", "llama-tiny", "--data", str(tmp_path / name), "--output-dir", str(out)) == 2
    assert said in _one_line(capsys)
    assert not out.exists()


def test_prepare_data_names_a_record_nested_too_deeply(tmp_path, capsys):
    _jsonl("deep.jsonl", [LINES[0], "{\"a\": " * 100_000 + "1" + "}" * 100_000, LINES[1]])(tmp_path)
    assert run_data.main([str(tmp_path / "out"), "--task", "sft", "--source", str(tmp_path / "deep.jsonl"),
                          "--vocab-size", "512"]) == 2
    assert "--source: file 'deep.jsonl' record 2 (line 2) is JSON that Python's json cannot read (lists or objects " \
           "nested too deeply); allowed: " in _one_line(capsys, "fp8lab prepare-data")
    assert not (tmp_path / "out").exists()


def test_prepare_data_names_the_val_fraction_flag(tmp_path, capsys):
    _jsonl("ok.jsonl", LINES)(tmp_path)
    assert run_data.main([str(tmp_path / "out"), "--task", "sft", "--source", str(tmp_path / "ok.jsonl"),
                          "--vocab-size", "512", "--val-fraction", "0.9"]) == 2
    assert "--val-fraction=0.9 is invalid; allowed: a number in (0, 0.5)" in _one_line(capsys, "fp8lab prepare-data")
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------------ the model's chat template

def _model_folder(path, template):
    """A model folder as --model reads it (config.json, tokenizer files) with ``template``; no weights: the runs here
    stop before a model is built."""
    LlamaConfig(vocab_size=512, **tiny_model.SHAPE, num_key_value_heads=4).save_pretrained(str(path))
    tok = tiny_model.tokenizer("llama")
    tok.chat_template = template
    tok.save_pretrained(str(path))
    return path


def test_a_template_that_refuses_a_record_is_named_in_one_line(tmp_path, capsys):
    folder = _model_folder(tmp_path / "refuses", REFUSES_SYSTEM)
    _jsonl("sys.jsonl", [LINES[0], json.dumps({**GOOD[1], "system": "Be brief."}), *LINES[2:]])(tmp_path)
    out = tmp_path / "run"
    assert _train("--model", str(folder), "--data", str(tmp_path / "sys.jsonl"), "--output-dir", str(out)) == 2
    assert ("--data: file 'sys.jsonl' record 2 (line 2): --model's chat template ('refuses') fails on it "
            "(TemplateError: System role not supported); allowed: records that template accepts (many refuse a "
            "system turn") in _one_line(capsys)
    assert not out.exists()
    # the same records without the system turn are what that template takes
    _jsonl("nosys.jsonl", LINES)(tmp_path)
    m = sft.prepare(tmp_path / "nosys.jsonl", tmp_path / "prep", model_tokenizer.load(str(folder)))
    assert m["documents"] == 6 and m["template"]["kind"] == "chat_template"


def test_a_template_that_does_not_append_turns_names_the_file_and_the_model(tmp_path, capsys):
    folder = _model_folder(tmp_path / "reorders", NOT_APPENDING)
    _jsonl("ok.jsonl", LINES)(tmp_path)
    assert run_data.main([str(tmp_path / "out"), "--task", "sft", "--source", str(tmp_path / "ok.jsonl"),
                          "--model", str(folder)]) == 2
    assert ("--source: file 'ok.jsonl' record 1 (line 1): --model's chat template ('reorders') does not render the "
            "conversation's earlier turns as the start of the later ones (turn 1), so the answer's tokens cannot be "
            "found; allowed: a template that appends each turn") in _one_line(capsys, "fp8lab prepare-data")
    assert not (tmp_path / "out" / "manifest.json").exists()


# ------------------------------------------------------------------------------------ damaged prepared folders

@pytest.fixture(scope="module")
def prepared_sft(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-prepared")
    _jsonl("r.jsonl", LINES)(root)
    sft.prepare(root / "r.jsonl", root / "good", model_tokenizer.load(None, 512))
    return root / "good"


def _edit_json(name, edit):
    def make(d):
        obj = json.loads((d / name).read_text())
        edit(obj)
        (d / name).write_text(json.dumps(obj))
    return make


def _halve(d):
    p = d / "train_mask_00000.bin"
    p.write_bytes(p.read_bytes()[:p.stat().st_size // 2])


DAMAGED = [  # (damage the copy, what the one line says after "--data: ")
    (lambda d: (d / "train_mask_00000.bin").unlink(), "'train_mask_00000.bin' in 'copy' is missing"),
    (_edit_json("train_examples.json", lambda e: e[0].__setitem__(1, e[0][1] + 3)),
     "'train_examples.json' in 'copy' lists 5 examples of 203 tokens, but the manifest's train split has 5 of 200"),
    (_halve, "'train_mask_00000.bin' in 'copy' holds 100 mask bytes, not the 200 (one per token) its manifest says"),
    (_edit_json("val_examples.json", lambda e: e.append([7])),
     "'val_examples.json' in 'copy' is not a list of [record, length] pairs of positive integers"),
    (lambda d: (d / "val_examples.json").unlink(), "'val_examples.json' in 'copy' is missing or unreadable"),
    (_edit_json("manifest.json", lambda m: m["splits"]["val"].pop("examples")),
     "'manifest.json' in 'copy' lacks 'examples' or has a wrong type there"),
]


@pytest.mark.parametrize("damage, said", DAMAGED, ids=["no-mask", "lengths-differ", "half-mask", "not-pairs",
                                                     "no-examples", "manifest-lacks-examples"])
def test_a_damaged_prepared_folder_is_refused_when_opened(prepared_sft, damage, said, tmp_path, capsys):
    copy = shutil.copytree(prepared_sft, tmp_path / "copy")
    damage(copy)
    out = tmp_path / "run"
    assert _train("--model", "llama-tiny", "--data", str(copy), "--output-dir", str(out)) == 2
    err = _one_line(capsys)
    assert f"--data: {said}" in err and err.endswith(PREPARED), err
    assert not out.exists()
