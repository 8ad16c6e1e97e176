"""fp8lab.records.ownership's file rules (issue 50): new files never through a link, a file is fp8lab's only with
the bytes its marker names, an append-only log by its first bytes, nothing else deleted."""
from __future__ import annotations

import os

import pytest

from fp8lab.records import ownership


def test_write_file_replaces_a_link_and_never_writes_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("years of work\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").symlink_to(victim)
    ownership.write_file(tmp_path / "run" / "summary.json", "{}\n")
    assert victim.read_text() == "years of work\n"
    assert not (tmp_path / "run" / "summary.json").is_symlink() and (tmp_path / "run" / "summary.json").read_text() == "{}\n"
    assert oct((tmp_path / "run" / "summary.json").stat().st_mode & 0o777) == oct(0o666 & ~ownership.UMASK)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["summary.json"]  # no temporary file left


@pytest.mark.parametrize("plant", ["file", "symlink", "dangling"])
def test_new_file_never_opens_an_existing_name(tmp_path, plant):
    victim = tmp_path / "victim.txt"
    victim.write_text("mine\n")
    target = tmp_path / "train_00000.bin"
    {"file": lambda: target.write_text("mine\n"), "symlink": lambda: target.symlink_to(victim),
     "dangling": lambda: target.symlink_to(tmp_path / "nowhere")}[plant]()
    with pytest.raises(OSError):
        ownership.new_file(target)
    assert victim.read_text() == "mine\n" and not (tmp_path / "nowhere").exists()


def test_a_file_is_fp8labs_only_with_the_bytes_its_marker_names(tmp_path):
    run = ownership.claim(tmp_path / "run", "run")
    ownership.write_file(run / "config.json", '{"a": 1}\n')
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    ownership.record(run, "config.json", "metrics.jsonl")
    assert ownership.foreign(run, "run") == []
    with open(run / "metrics.jsonl", "a") as fh:  # an append-only log grows: still fp8lab's
        fh.write('{"step": 2}\n')
    assert ownership.foreign(run, "run") == []
    (run / "config.json").write_text('{"a": 2}\n')  # edited by hand: no longer fp8lab's bytes
    (run / "notes.txt").write_text("mine\n")
    assert ownership.foreign(run, "run") == ["config.json", "notes.txt"]
    (run / "metrics.jsonl").write_text('{"step": 9}\n')  # its first bytes changed
    assert "metrics.jsonl" in ownership.foreign(run, "run")


def test_a_hard_link_or_a_marker_of_another_kind_is_not_fp8labs(tmp_path):
    tokens = ownership.claim(tmp_path / "tokens", "tokens")
    ownership.write_file(tokens / "manifest.json", "{}\n")
    ownership.record(tokens, "manifest.json")
    os.link(tokens / "manifest.json", tmp_path / "elsewhere.json")  # the same bytes under a second name
    assert ownership.foreign(tokens, "tokens") == ["manifest.json"]
    assert ownership.foreign(tokens, "model") == [".fp8lab-owner.json (an fp8lab tokens folder, not a model folder)"]
    with pytest.raises(ValueError, match=r"^--model-dir='.*tokens' is an fp8lab tokens folder, not a model folder; "
                                         r".*allowed: a new or empty folder, or an fp8lab model folder$"):
        ownership.refuse_foreign("--model-dir", tokens, "model")


def test_remove_own_deletes_only_unchanged_files_fp8lab_wrote(tmp_path):
    tokens = ownership.claim(tmp_path / "tokens", "tokens")
    for name in ("train_00000.bin", "val_00000.bin"):
        with ownership.new_file(tokens / name) as fh:
            fh.write(b"\x01\x02")
    ownership.record(tokens, "train_00000.bin", "val_00000.bin")
    (tokens / "val_00000.bin").write_bytes(b"changed by the user")
    ownership.remove_own(tokens, "tokens")
    assert sorted(p.name for p in tokens.iterdir()) == [".fp8lab-owner.json", "val_00000.bin"]
    assert (tokens / "val_00000.bin").read_bytes() == b"changed by the user"
