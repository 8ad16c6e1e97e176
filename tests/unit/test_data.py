"""The data pipeline: shipped corpus and tokenizers, token shards, and the deterministic loader."""
from __future__ import annotations

import json
import lzma

import numpy as np
import pytest

from fp8lab.data import tokens as data
from fp8lab.data import run_data


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The shipped corpus tokenized with the 512 tokenizer, in small shards to cross boundaries."""
    out = tmp_path_factory.mktemp("prep")
    data.prepare_data(None, out, None, 0.05, vocab_size=512, shard_tokens=300_000)
    return out


def test_corpus_is_real_english_text():
    text = lzma.open(data.CORPUS_DIR / "kjv.txt.xz", "rt", encoding="utf-8").read()
    assert text.startswith("In the beginning God created the heaven and the earth.")
    assert len(text) > 4_000_000
    docs = list(data.read_documents(data.default_corpus()))
    assert len(docs) == 1189  # chapters of the KJV
    assert text.count("\n") - (len(docs) - 1) == 31102  # verses


@pytest.mark.parametrize("vocab", [512, 32000])
def test_tokenizer_retraining_reproduces_shipped_file(vocab):
    shipped = data.shipped_tokenizer_path(vocab).read_text()
    again = data.train_tokenizer(None, vocab)
    assert again.to_str(pretty=True) == shipped
    assert again.token_to_id(data.EOS_TOKEN) == 0


def test_shipped_tokenizer_sizes_and_round_trip():
    big, small = data.load_tokenizer(), data.load_tokenizer(vocab_size=512)
    assert small.get_vocab_size() == 512
    assert 20000 < big.get_vocab_size() <= 32000  # the corpus saturates below the 32000 target
    s = "And God said, Let there be light: and there was light."
    for tok in (big, small):
        assert tok.decode(tok.encode(s).ids) == s
    assert len(big.encode(s).ids) < len(small.encode(s).ids) < len(s.encode())


def test_prepare_writes_manifest_and_memmap_shards(prepared):
    m = data.read_manifest(prepared)
    assert m["format"] == "fp8lab-tokens" and m["dtype"] == "uint16" and m["vocab_size"] == 512
    assert m["source"] == {"kind": "local", "files": ["kjv.txt.xz"], "sha256": data.source_digest(data.default_corpus())}
    train, val = m["splits"]["train"], m["splits"]["val"]
    assert len(train["shards"]) > 1 and all(s["tokens"] <= 300_000 for s in train["shards"])
    assert val["documents"] == 1189 // 20 and train["documents"] + val["documents"] == 1189
    tok = data.load_tokenizer(prepared)
    arr = np.memmap(prepared / train["shards"][0]["file"], dtype=np.uint16, mode="r")
    assert len(arr) == train["shards"][0]["tokens"]
    assert tok.decode(arr[:9].tolist()).startswith("In the beginning God")
    eos_count = sum(int((np.memmap(prepared / s["file"], dtype=np.uint16, mode="r") == m["eos_id"]).sum()) for s in train["shards"])
    assert eos_count == train["documents"]


def test_read_crosses_shard_boundaries(prepared):
    shards = data.TokenShards(prepared, "train")
    b = int(shards.starts[1])
    whole = np.concatenate([np.asarray(a) for a in shards.arrays]).astype(np.int64)
    assert np.array_equal(shards.read(b - 5, 10), whole[b - 5:b + 5])
    with pytest.raises(IndexError):
        shards.read(len(shards) - 3, 10)


def test_loader_is_deterministic_and_resumes_exactly(prepared):
    a = data.TokenLoader(prepared, "train", 32, 4, seed=7)
    first = [a.next_batch() for _ in range(5)]
    b = data.TokenLoader(prepared, "train", 32, 4, seed=7)
    for x, y in first:
        bx, by = b.next_batch()
        assert torch_equal(x, bx) and torch_equal(y, by)
        assert torch_equal(x[:, 1:], y[:, :-1])  # labels are inputs shifted by one
    state = b.state_dict()
    expected = b.next_batch()
    c = data.TokenLoader(prepared, "train", 32, 4, seed=7)
    c.load_state_dict(state)
    assert torch_equal(c.next_batch()[0], expected[0])
    other = data.TokenLoader(prepared, "train", 32, 4, seed=8)
    assert not torch_equal(other.next_batch()[0], first[0][0])
    with pytest.raises(ValueError, match="seed"):
        other.load_state_dict(state)


def test_ranks_and_accumulation_read_the_same_samples_as_one_process(prepared):
    """2 ranks x 2 micro-batches of 2 == 1 rank x 2 micro-batches of 4 == 1 rank x 1 of 8 per step."""
    def step_samples(world, micro, accum, steps=3):
        loaders = [data.TokenLoader(prepared, "train", 16, micro, seed=3, rank=r, world_size=world) for r in range(world)]
        out = []
        for _ in range(steps):
            rows = []
            for _ in range(accum):
                for ld in loaders:
                    rows.append(ld.next_batch()[0])
            out.append(sorted(tuple(r.tolist()) for batch in rows for r in batch))
        return out

    one = step_samples(1, 8, 1)
    assert step_samples(2, 2, 2) == one
    assert step_samples(1, 4, 2) == one
    assert step_samples(4, 1, 2) == one


def test_epochs_wrap_with_a_new_order(prepared):
    ld = data.TokenLoader(prepared, "val", 512, 1, seed=0)
    n = ld.num_windows
    firsts = [ld._window(g) for g in range(n)]
    seconds = [ld._window(g) for g in range(n, 2 * n)]
    assert sorted(firsts) == sorted(seconds) == list(range(n)) and firsts != seconds


def test_prepare_from_local_text_and_bad_inputs(tmp_path):
    src = tmp_path / "texts"
    src.mkdir()
    (src / "a.txt").write_text("\n\n".join(f"Document number {i} says hello to the reader." for i in range(40)))
    out = tmp_path / "out"
    m = data.prepare_data(src, out, data.shipped_tokenizer_path(512), 0.1)
    assert m["documents"] == 40 and m["splits"]["val"]["documents"] == 4
    assert json.loads((out / "manifest.json").read_text()) == m
    with pytest.raises(ValueError, match="val_fraction"):
        data.prepare_data(src, out, None, 0.7)
    with pytest.raises(ValueError, match="no text files"):
        (tmp_path / "empty").mkdir()
        data.prepare_data(tmp_path / "empty", out)
    with pytest.raises(ValueError, match="tokenizer"):
        data.prepare_data(src, out, tmp_path / "nope.json")
    with pytest.raises(ValueError, match="manifest"):
        data.TokenLoader(tmp_path, "train", 8, 1)
    with pytest.raises(ValueError, match="split"):
        data.TokenLoader(out, "test", 8, 1)
    with pytest.raises(ValueError, match="seq_len"):
        data.TokenLoader(out, "train", 0, 1)


def test_hf_dataset_name_offline_is_a_clear_error(tmp_path):
    with pytest.raises(RuntimeError, match="Hugging Face dataset"):
        data.prepare_data("hf:wikitext", tmp_path / "out")


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_command_line_prepares_a_channel_folder(tmp_path, capsys):
    src = tmp_path / "a.txt"
    src.write_text("\n\n".join(f"Line {i} of a small text." for i in range(30)))
    assert run_data.main([str(tmp_path / "chan"), "--source", str(src), "--vocab-size", "512", "--val-fraction", "0.1"]) == 0
    assert "vocab 512" in capsys.readouterr().out
    assert data.read_manifest(tmp_path / "chan")["documents"] == 30
    assert run_data.main([str(tmp_path / "x"), "--source", str(tmp_path / "missing.txt")]) == 2
    assert "is not an existing file or folder" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["../../../../etc/hostname", "/etc/hostname", "sub/../../x.bin", "link.bin"])
def test_shards_are_read_only_from_inside_the_prepared_folder(prepared, tmp_path, name):
    """Issue 30: a manifest shard path ../../../../etc/... was memory-mapped as tokens."""
    import shutil

    d = tmp_path / "tokens"
    shutil.copytree(prepared, d)
    (tmp_path / "outside.bin").write_bytes((d / "train_00000.bin").read_bytes())
    (d / "link.bin").symlink_to(tmp_path / "outside.bin")  # a link leaving the folder counts as outside
    m = json.loads((d / "manifest.json").read_text())
    m["splits"]["train"]["shards"][0]["file"] = name
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=r"the manifest in 'tokens' names a file outside its folder"):
        data.TokenShards(d, "train")
    from fp8lab.data import checks as data_checks  # the prepared folder's checks (fp8lab.data.checks)

    with pytest.raises(ValueError, match=r"^--data: the manifest in 'tokens' names a file outside its folder"):
        data_checks.check_prepared_folder(d)


def test_token_ids_past_the_vocabulary_are_refused_before_training(prepared, tmp_path):
    import shutil

    from fp8lab.data import checks as data_checks

    d = tmp_path / "tokens"
    shutil.copytree(prepared, d)
    m = data.read_manifest(d)
    assert data_checks.check_prepared_folder(d) == m  # the shipped corpus: every id below vocab_size
    ids = np.memmap(d / "train_00000.bin", dtype=m["dtype"], mode="r+")
    ids[-1] = m["vocab_size"]  # the first id past it, in the last token of the split
    ids.flush()
    del ids
    with pytest.raises(ValueError, match=rf"shard 'train_00000.bin' in 'tokens' holds token id {m['vocab_size']}, "
                                         rf"outside the manifest's vocab_size {m['vocab_size']}"):
        data_checks.check_prepared_folder(d)
    assert data_checks.check_prepared_folder(d, scan_tokens=False) == m  # the scan is a step of its own
    with pytest.raises(ValueError, match="holds token id"):
        data_checks.scan_token_ids(str(d))


def test_a_job_scans_the_token_ids_once_on_rank_0_and_every_rank_follows(prepared, monkeypatch, tmp_path):
    """Every rank once read every shard; now rank 0 scans and broadcasts the outcome (fp8lab.train.trainer.scan_data_once)."""
    import torch

    from fp8lab.data import checks as data_checks
    from fp8lab.train import trainer
    from fp8lab.train import distributed as fdist

    scans, sent = [], []
    monkeypatch.setattr(data_checks, "check_token_ids", lambda folder, m, option="--data": scans.append(folder))

    def env(rank):
        return fdist.DistEnv(rank=rank, local_rank=rank, world_size=2, device=torch.device("cpu"), initialized_here=False)

    rank0_says = "--data: shard 'train_00000.bin' holds token id 600 (rank 0's scan)"
    monkeypatch.setattr(fdist, "broadcast_object", lambda obj, e: sent.append(obj) or (obj if e.is_main else rank0_says))
    with pytest.raises(ValueError, match=r"rank 0's scan"):
        trainer.scan_data_once(str(prepared), env(1))  # rank 1 reads no shard and refuses as rank 0 did
    assert scans == [] and sent == [None]
    trainer.scan_data_once(str(prepared), env(0))
    assert len(scans) == 1 and sent == [None, None]
    called = []
    monkeypatch.setattr(data_checks, "check_prepared_folder", lambda f, o="--data", scan_tokens=True: called.append(scan_tokens))
    from fp8lab.train import run_paths
    from fp8lab.train.entry import TrainConfig

    monkeypatch.chdir(tmp_path)
    c = TrainConfig(data=str(prepared), checkpoint_every=-1, save_model=False)
    run_paths.check_run(c, run_paths.resolve_paths(c), str(prepared), scan_tokens=False)
    assert called == [False]  # what trainer.run asks for: the folder checked, its ids left to rank 0


def test_json_lines_sources_hold_one_document_per_line_blank_lines_kept(tmp_path):
    """Source code keeps its blank lines: a .jsonl(.xz) source is one {"text": ...} document per line (issue 31)."""
    import json
    import lzma

    docs = [f"int f{i}(void)\n{{\n\n    return {i};\n}}\n" for i in range(40)]
    src = tmp_path / "code.jsonl.xz"
    with lzma.open(src, "wt", encoding="utf-8") as fh:
        fh.writelines(json.dumps({"path": f"f{i}.c", "text": d}) + "\n" for i, d in enumerate(docs))
    assert list(data.read_documents([src])) == docs
    from fp8lab.data import checks as data_checks

    data_checks.check_data_source(str(src))  # 40 documents: enough for the split
    m = data.prepare_data(str(src), tmp_path / "out", None, vocab_size=512)
    assert m["documents"] == 40 and m["splits"]["val"]["documents"] == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"body": "b"}\n')
    with pytest.raises(ValueError, match=r"line 2 of 'bad.jsonl' is not a JSON object with a \"text\" string"):
        list(data.read_documents([bad]))
