"""The rules about a prepared token cache: when it is reused (one rule, fp8lab.data.tokens.reusable_cache, for the
BPE cache of fp8lab.data.tokens.ensure_prepared and every cache of fp8lab.data.run_data), and which temporary
folder beside it is stale (its maker, a process of this host, is gone)."""
from __future__ import annotations

import os
import socket
from pathlib import Path

from fp8lab.data import run_data
from fp8lab.data import tokens as fdata
from fp8lab.records import ownership


def text(path: Path, seed: int) -> Path:
    """A small text corpus (200 documents), different for each ``seed``."""
    words = ["light", "water", "stone", "field", "river", "bread", "house", "night", "morning", "king"]
    docs = [" ".join(words[(i * 7 + j * seed) % len(words)] for j in range(40)) + f" {seed}." for i in range(200)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


def test_both_entry_points_ask_the_one_reuse_rule(tmp_path, monkeypatch):
    a = text(tmp_path / "a.txt", 1)
    cache = tmp_path / "cache"
    assert fdata.ensure_prepared(str(a), cache, 512) == cache
    written = (cache / "manifest.json").stat().st_mtime_ns
    asked = []
    rule = fdata.reusable_cache
    monkeypatch.setattr(fdata, "reusable_cache", lambda *args, **kw: asked.append(kw) or rule(*args, **kw))
    assert fdata.ensure_prepared(str(a), cache, 512) == cache
    assert run_data.ensure_prepared(str(a), cache, 512) == cache  # fp8lab's BPE: through fdata.ensure_prepared
    assert run_data.ensure_prepared(str(a), cache, 512, accept=lambda staged: None) == cache
    assert len(asked) == 3 and asked[-1] == {"tokenizer_source": fdata.BPE_SOURCE, "task": "pretrain"}
    assert (cache / "manifest.json").stat().st_mtime_ns == written  # reused each time, never prepared again


def test_the_reuse_rule(tmp_path):
    a, b = text(tmp_path / "a.txt", 1), text(tmp_path / "b.txt", 3)
    cache = tmp_path / "cache"
    assert not fdata.reusable_cache(cache, str(a), 512)  # nothing prepared there
    fdata.ensure_prepared(str(a), cache, 512)
    vocab = fdata.read_manifest(cache)["vocab_size"]
    model = {"kind": "model", "name": "m", "files": ["tokenizer.json"], "sha256": "0" * 64}
    cases = [((str(a), vocab), {}, True), ((str(a), vocab + 1000), {}, True),  # a larger model fits the tokens
             ((str(a), vocab - 1), {}, False),  # the model has fewer rows than the tokenizer's ids
             ((str(b), vocab), {}, False), ((str(a), vocab), {"task": "sft"}, False),
             ((str(a), vocab), {"tokenizer_source": model}, False),
             ((str(a), vocab), {"tokenizer_source": fdata.BPE_SOURCE}, True)]
    for (source, size), kw, reused in cases:
        assert fdata.reusable_cache(cache, source, size, **kw) is reused, (source, size, kw)
    # run_data's wrapper says the same for fp8lab's BPE (model None) as the rule itself
    for source, size, task, reused in [(a, vocab, "pretrain", True), (b, vocab, "pretrain", False),
                                       (a, vocab - 1, "pretrain", False), (a, vocab, "sft", False)]:
        assert run_data._reusable(str(source), cache, size, None, task) is reused
    # other text: fdata.ensure_prepared prepares the cache again
    assert fdata.ensure_prepared(str(b), cache, 512) == cache
    assert fdata.read_manifest(cache)["source"]["sha256"] == fdata.source_digest([b])


def test_a_temporary_folder_is_stale_only_when_its_maker_on_this_host_is_gone():
    here, live = "node-a", {100, 200}
    tag = run_data._host_tag(here)

    def name(role: str, pid: int) -> str:
        return f"{ownership.TMP_PREFIX}data-{role}{pid}-{tag}-0123abcd"

    names = [name("", 100), name("", 300), name("old-", 200), name("old-", 400),
             f"{ownership.TMP_PREFIX}data-300-{run_data._host_tag('node-b')}-0123abcd",  # another host's pid 300
             f"{ownership.TMP_PREFIX}data-0123abcd", f"{ownership.TMP_PREFIX}data-old-0123abcd",  # no maker named
             f"{ownership.TMP_PREFIX}other-300-{tag}-0123abcd",  # beside another cache
             f"{ownership.TMP_PREFIX}data-0-{tag}-0123abcd", "data"]
    assert run_data._stale_temp_folders(names, "data", here, live.__contains__) == [name("", 300), name("old-", 400)]
    assert run_data._stale_temp_folders(names, "data", "node-b", live.__contains__) == [names[4]]


def test_a_temporary_folder_names_its_maker(tmp_path):
    made = run_data._temp_folder(tmp_path / "data", "")
    assert made.parent == tmp_path and made.name.startswith(f"{ownership.TMP_PREFIX}data-{os.getpid()}-")
    assert run_data._stale_temp_folders([made.name], "data", socket.gethostname(), lambda pid: False) == [made.name]
    assert run_data._stale_temp_folders([made.name], "data", socket.gethostname(), run_data._alive) == []
    assert run_data._alive(os.getpid()) and not run_data._alive(2 ** 22 + 1)  # past Linux's largest pid
