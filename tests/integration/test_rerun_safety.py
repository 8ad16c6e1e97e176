"""A re-run into a run's folder that cannot go on is refused before it tokenizes, builds or writes anything there, and
the earlier run's files stay byte for byte (checkpoints, metrics, prepared tokens): other data or another model than
the checkpoint's, and a run stopped without a checkpoint (``--checkpoint-every -1``), whose Ctrl-C says so."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from interrupted import interrupt_after  # tests/helpers
from refusals import refused  # tests/helpers
from fp8lab.core.paths import REPO_ROOT
from fp8lab.data import sft, tiny_model
from fp8lab.data import tokens as fdata
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.train import entry as ftrain

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1"}
QUIET = ("--device", "cpu", "--progress", "off", "--plot", "False", "--print-metrics", "False")


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` (hidden ones too) with its content digest."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def jsonl(path: Path, first: int, count: int) -> Path:
    """``count`` records of the shipped instruction set from record ``first`` on."""
    lines = sft.shipped().read_text().splitlines()[first:first + count]
    path.write_text("\n".join(lines) + "\n")
    return path


def text(path: Path, seed: int) -> Path:
    """A small text corpus (200 documents), different for each ``seed``."""
    words = ["light", "water", "stone", "field", "river", "bread", "house", "night", "morning", "king"]
    docs = [" ".join(words[(i * 7 + j * seed) % len(words)] for j in range(40)) + f" {seed}." for i in range(200)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {f: str(tiny_model.build(root / f, f)) for f in ("llama", "qwen2")}


def test_a_refused_rerun_leaves_the_finished_runs_prepared_tokens(folders, tmp_path, capsys, monkeypatch):
    data, out = jsonl(tmp_path / "edit.jsonl", 0, 20), tmp_path / "base2"
    base = ("--task", "sft", "--steps", "2", "--seq-len", "256", *QUIET, "--output-dir", str(out), "--data", str(data))
    assert ftrain.main(["--model", folders["llama"], *base]) == 0
    before = tree(out)
    assert {"data/manifest.json", "checkpoints/step_00000002/.metadata", "metrics.jsonl"} <= set(before)
    jsonl(data, 30, 16)  # the user edits the records: other data than the checkpoint's
    err = refused(["--model", folders["llama"], *base], capsys)
    assert f"checkpoint {out / 'checkpoints' / 'step_00000002'} was trained on other data (data: 'sha256:" in err
    assert tree(out) == before and not list(out.glob(ownership.TMP_PREFIX + "*"))  # the new tokens went, unused
    # another model into the run's folder: said as such before anything is tokenized (not as a checkpoint that fails
    # to load, nor with --resume False, which a finished run refuses)
    monkeypatch.setattr(sft, "prepare", lambda *a, **k: pytest.fail("tokenized before the refusal"))
    err = refused(["--model", folders["qwen2"], *base], capsys)
    assert err == (f"fp8lab train: error: --output-dir={str(out)!r} holds a run of another model (model: "
                   f"{folders['llama']!r} there, {folders['qwen2']!r} here); allowed: the same --model to resume, or "
                   "another --output-dir")
    assert tree(out) == before


def test_a_refused_pretrain_rerun_leaves_its_token_cache(tmp_path, capsys):
    data, out = text(tmp_path / "corpus.txt", 1), tmp_path / "run"
    base = ["--model", "llama-tiny", "--steps", "2", "--seq-len", "32", "--micro-batch-size", "2", "--save-model",
            "False", *QUIET, "--data", str(data), "--output-dir", str(out)]
    assert ftrain.main(base) == 0
    before = tree(out)
    assert {"data/manifest.json", "checkpoints/step_00000002/.metadata", "metrics.jsonl"} <= set(before)
    text(data, 3)
    err = refused(base, capsys)
    assert "was trained on other data (data: 'sha256:" in err and "start afresh in a new --output-dir" in err
    assert tree(out) == before and not list(out.glob(ownership.TMP_PREFIX + "*"))


def test_ctrl_c_without_checkpoints_says_so_and_a_rerun_keeps_its_metrics(tmp_path, capsys):
    data, out = text(tmp_path / "corpus.txt", 1), tmp_path / "run"
    base = ["--model", "llama-tiny", "--seq-len", "32", "--micro-batch-size", "2", "--save-model", "False",
            "--checkpoint-every", "-1", *QUIET, "--output-dir", str(out)]
    code, stdout, stderr = interrupt_after([sys.executable, "-m", "fp8lab.train", *base, "--steps", "100000",
                                            "--data", str(data)], ENV, out / "metrics.jsonl")
    assert code == 0 and "Traceback" not in stderr, stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    step = summary["steps"]
    assert summary["status"] == "interrupted" and step >= 1
    assert summary["message"] == (
        f"fp8lab: SIGINT received: stopped at step {step}; no checkpoint written (--checkpoint-every -1); "
        "metrics.jsonl and summary.json are kept; a restart starts over from step 1: --resume False in this "
        "--output-dir (replacing them), or another --output-dir")
    assert summary["message"] in stdout and "checkpoint written at" not in stdout
    assert not (out / "checkpoints").exists()
    before = tree(out)
    for steps in ("100000", "3"):  # the same command, or other --steps: refused, nothing replaced
        err = refused([*base, "--steps", steps, "--data", str(data)], capsys)
        assert err == (f"fp8lab train: error: --output-dir={str(out)!r} holds a run stopped at step {step} (its "
                       f"metrics.jsonl, summary.json) and no checkpoint to resume from in --checkpoint-dir "
                       f"{str(out / 'checkpoints')!r}; starting afresh would replace them; allowed: another "
                       "--output-dir, or --resume False to start over in this one")
        assert tree(out) == before
    # --resume False starts over, here on other text: its tokens replace the cache's once the run is accepted
    other = text(tmp_path / "other.txt", 3)
    assert ftrain.main([*base, "--steps", "2", "--resume", "False", "--data", str(other)]) == 0
    assert [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] == [1, 2]
    assert fdata.read_manifest(out / "data")["source"]["sha256"] == fdata.source_digest([other])
    assert not list(out.glob(ownership.TMP_PREFIX + "*"))
