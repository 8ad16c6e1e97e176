"""Nothing lost, nothing run that the user did not ask for (issue 30, part A), on CPU with tiny runs.

Each test is one case of the second hostile-user probe: fp8lab never deletes or overwrites files it
did not write and refuses folders that overlap; a crafted checkpoint runs no code; a second run on
an output folder is refused while the first lives; the token cache and the checkpoint know which
data they hold; Ctrl-C is a clean stop; a summary or export that cannot be written is exit code 4
with the weights kept; a finished run's command re-run leaves its summary as it was.
"""
from __future__ import annotations

import hashlib
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from interrupted import interrupt_after  # tests/helpers
from refusals import refused  # tests/helpers
from fp8lab.train import checkpoint as fckpt
from fp8lab.data import tokens as fdata
from fp8lab.data import run_data
from fp8lab.records import metrics as fmetrics
from fp8lab.train import entry as ftrain
from fp8lab.core.paths import REPO_ROOT
from fp8lab.train.entry import TrainConfig, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
TINY = dict(model="llama-tiny", seq_len=32, micro_batch_size=2, compute_dtype="fp32", plot=False, progress="off",
            print_metrics=False, save_model=False)


def argv(*extra: str) -> list[str]:
    return ["--model", "llama-tiny", "--seq-len", "32", "--micro-batch-size", "2", "--compute-dtype", "fp32",
            "--progress", "off", "--plot", "False", "--print-metrics", "False", *extra]


def tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its content digest."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def corpus(path: Path, seed: int) -> Path:
    """A small text corpus (200 documents), different for each ``seed``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    words = ["light", "water", "stone", "field", "river", "bread", "house", "night", "morning", "king"]
    docs = [" ".join(words[(i * 7 + j * seed) % len(words)] for j in range(40)) + f" {seed}." for i in range(200)]
    path.write_text("\n\n".join(docs) + "\n")
    return path


# ------------------------------------------------------------------------------ 1. files fp8lab did not write

def test_foreign_files_in_the_token_cache_are_kept_and_the_run_refused(tmp_path, capsys):
    out = tmp_path / "run"
    (out / "data" / "sub").mkdir(parents=True)
    (out / "data" / "thesis.tex").write_text("\\section{Years of work}\n")
    (out / "data" / "sub" / "results.csv").write_text("a,b\n1,2\n")
    src = corpus(tmp_path / "text" / "corpus.txt", 1)
    before = tree(tmp_path)
    err = refused(argv("--steps", "1", "--save-model", "False", "--data", str(src), "--output-dir", str(out)), capsys)
    assert "holds files fp8lab did not write (sub, thesis.tex)" in err and "a new or empty folder" in err
    assert tree(tmp_path) == before


def test_data_inside_the_output_folders_token_cache_is_refused_before_it_is_read(tmp_path, capsys):
    proj = tmp_path / "proj"
    corpus(proj / "data" / "corpus.txt", 1)
    before = tree(tmp_path)
    err = refused(argv("--steps", "1", "--data", str(proj / "data"), "--output-dir", str(proj)), capsys)
    assert "--output-dir (its token cache data/) is inside --data ('data')" in err
    assert tree(tmp_path) == before


@pytest.mark.parametrize("where", [".", "data", "data/run", "fp8lab/run"])
def test_the_checkout_is_never_an_output_folder(where, capsys):
    if not (REPO_ROOT / "pyproject.toml").is_file():
        pytest.skip("fp8lab is not running from a checkout")
    before = sorted(p.name for p in (REPO_ROOT / "data").iterdir())
    err = refused(argv("--steps", "1", "--output-dir", str(REPO_ROOT / where)), capsys)
    assert "is in the fp8lab checkout" in err and "fp8lab never writes there" in err
    assert sorted(p.name for p in (REPO_ROOT / "data").iterdir()) == before
    assert not (REPO_ROOT / "data" / "run").exists() and not (REPO_ROOT / "fp8lab" / "run").exists()


def test_output_folder_is_not_the_model_folder(tmp_path, capsys):
    from transformers import LlamaConfig

    model = tmp_path / "my-llama"
    LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=256).save_pretrained(str(model))
    before = tree(tmp_path)
    err = refused(argv("--steps", "1", "--model", str(model), "--output-dir", str(model)), capsys)
    assert "--output-dir is inside --model ('my-llama')" in err
    err = refused(argv("--steps", "1", "--model", str(model), "--output-dir", str(tmp_path / "r"),
                       "--model-dir", str(model)), capsys)
    assert "--model-dir is inside --model ('my-llama')" in err
    assert tree(tmp_path) == before  # config.json as it was


def test_model_dir_and_output_dir_must_differ(tmp_path, capsys):
    out = tmp_path / "r"
    err = refused(argv("--steps", "1", "--output-dir", str(out), "--model-dir", str(out)), capsys)
    assert "--output-dir and --model-dir are the same folder ('r')" in err
    err = refused(argv("--steps", "1", "--output-dir", str(out), "--checkpoint-dir", str(out)), capsys)
    assert "--output-dir and --checkpoint-dir are the same folder ('r')" in err
    assert not out.exists()


def test_an_output_folder_holding_the_users_files_is_refused(tmp_path, prepared, capsys):
    out = tmp_path / "proj"
    out.mkdir()
    (out / "config.json").write_text('{"my": "settings"}\n')  # the same name fp8lab writes, not fp8lab's
    (out / "notes.md").write_text("mine\n")
    before = tree(tmp_path)
    err = refused(argv("--steps", "1", "--data", str(prepared), "--output-dir", str(out)), capsys)
    assert "--output-dir=" in err and "holds files fp8lab did not write (config.json, notes.md)" in err
    assert tree(tmp_path) == before


def test_a_model_folder_in_a_folder_fp8lab_did_not_write_is_not_exported_over(tmp_path, prepared, capsys):
    from transformers import LlamaConfig

    proj = tmp_path / "proj"
    LlamaConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4).save_pretrained(str(proj / "model"))
    before = tree(tmp_path)
    err = refused(argv("--steps", "1", "--data", str(prepared), "--output-dir", str(proj), "--save-model", "True"), capsys)
    assert "--model-dir=" in err and "holds files fp8lab did not write (config.json)" in err
    assert tree(tmp_path) == before


def test_prepare_data_never_deletes_shards_it_did_not_write(tmp_path, capsys):
    out = tmp_path / "tokens"
    out.mkdir()
    (out / "train_00000.bin").write_bytes(b"someone else's tokens")
    (out / "val_00000.bin").write_bytes(b"and more")
    src = corpus(tmp_path / "corpus.txt", 1)
    before = tree(tmp_path)
    assert run_data.main([str(out), "--source", str(src), "--vocab-size", "512"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fp8lab prepare-data: error: OUT_DIR=") and "holds files fp8lab did not write" in err
    assert tree(tmp_path) == before
    with pytest.raises(ValueError, match="holds files fp8lab did not write"):
        fdata.prepare_data(src, out, None, vocab_size=512)
    assert tree(tmp_path) == before


def test_prepare_data_again_replaces_only_its_own_files(tmp_path):
    out = tmp_path / "tokens"
    fdata.prepare_data(corpus(tmp_path / "a.txt", 1), out, None, vocab_size=512)
    assert json.loads((out / ".fp8lab-owner.json").read_text())["kind"] == "tokens"
    m = fdata.prepare_data(corpus(tmp_path / "b.txt", 3), out, None, vocab_size=512, shard_tokens=1000)
    assert m["source"]["files"] == ["b.txt"] and len(m["splits"]["train"]["shards"]) > 1
    written = {s["file"] for sp in m["splits"].values() for s in sp["shards"]}
    assert {p.name for p in out.iterdir()} == written | {"manifest.json", "tokenizer.json", ".fp8lab-owner.json",
                                                        ".fp8lab-lock"}  # the lock one writer at a time takes


# ------------------------------------------------------------------------------ 2. checkpoints run no code

class _Payload:
    """Unpickling this creates ``target``: what a crafted checkpoint file would do."""

    def __init__(self, target: Path):
        self.target = target

    def __reduce__(self):
        return (Path.touch, (self.target,))


def _two_checkpoints(prepared, out: Path) -> dict:
    cfg = dict(**TINY, steps=4, checkpoint_every=2, data=str(prepared), output_dir=str(out))
    train(TrainConfig(**cfg))
    return cfg


def test_a_crafted_trainer_state_is_not_unpickled(prepared, tmp_path, capsys):
    cfg = _two_checkpoints(prepared, tmp_path / "run")
    pwned = tmp_path / "pwned"
    newest = tmp_path / "run" / "checkpoints" / "step_00000004"
    import torch

    torch.save({"train_state": _Payload(pwned)}, newest / "trainer_rank0.pt")
    capsys.readouterr()
    s = train(TrainConfig(**cfg))
    out = capsys.readouterr().out
    assert not pwned.exists()
    assert "checkpoint step_00000004 does not load (UnpicklingError" in out and "trying an older one" in out
    assert s["resumed_from_step"] == 2 and s["status"] == "completed"


def test_crafted_dcp_metadata_is_not_unpickled_even_with_a_matching_digest(prepared, tmp_path, capsys):
    cfg = _two_checkpoints(prepared, tmp_path / "run")
    pwned = tmp_path / "pwned"
    newest = tmp_path / "run" / "checkpoints" / "step_00000004"
    for matching_digest in (False, True):
        (newest / ".metadata").write_bytes(pickle.dumps(_Payload(pwned)))
        if matching_digest:  # the attacker also rewrites fp8lab's manifest: the metadata reader still runs no code
            fckpt._write_manifest(newest, 4)
        capsys.readouterr()
        s = train(TrainConfig(**cfg))
        out = capsys.readouterr().out
        assert not pwned.exists()
        assert s["resumed_from_step"] == 2 and s["status"] == "completed"
        assert ("step_00000004 does not load (" + ("UnpicklingError: .metadata refers to pathlib.Path.touch" if matching_digest
                else "ValueError: its .metadata is not the one fp8lab wrote")) in out, out


def test_a_checkpoint_without_fp8labs_manifest_does_not_load(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    args = argv("--steps", "2", "--save-model", "False", "--data", str(prepared), "--output-dir", str(out))
    assert ftrain.main(args) == 0
    (out / "checkpoints" / "step_00000002" / fckpt.MANIFEST).unlink()
    err = refused(args, capsys)  # a step this run may save over: refused at the start
    assert "holds step_00000002, not written by fp8lab, where this run of 2 steps may save its own" in err
    err = refused(args + ["--checkpoint-every", "-1"], capsys)  # only read: it does not load
    assert "no checkpoint in 'checkpoints' loads (step_00000002: ValueError: not written by fp8lab" in err


# ------------------------------------------------------------------------------ 3. one run per output folder

def test_a_second_run_on_a_locked_output_folder_is_refused_and_a_dead_holder_is_stale(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from fp8lab.records import runlock; held = runlock.acquire('--output-dir', sys.argv[1]);"
         " print('locked', flush=True); time.sleep(120)", str(out)],
        env={**ENV, "PYTHONPATH": str(REPO_ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        args = argv("--steps", "2", "--save-model", "False", "--data", str(prepared), "--output-dir", str(out))
        err = refused(args, capsys)
        assert f"--output-dir={str(out)!r} is in use by another fp8lab run (pid {holder.pid} on " in err
        assert "wait for it to finish, or another --output-dir" in err
        assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()
    finally:
        holder.kill()
        holder.wait(timeout=30)
        holder.stdout.close()
    assert ftrain.main(args) == 0  # the holder died (kill -9): its lock went with it
    assert (out / ".fp8lab-lock").read_text() == ""  # released at the end, no pid or host left behind


# ------------------------------------------------------------------------------ 4. data identity

def test_resuming_with_other_data_is_refused(prepared, tmp_path, capsys):
    other = tmp_path / "other"
    fdata.prepare_data(corpus(tmp_path / "corpus.txt", 3), other, None, vocab_size=512)
    out = tmp_path / "run"
    base = ("--steps", "2", "--save-model", "False", "--output-dir", str(out))
    assert ftrain.main(argv(*base, "--data", str(prepared))) == 0
    err = refused(argv(*base, "--steps", "4", "--resume-with-new-settings", "--data", str(other)), capsys)
    assert "was trained on other data (data: 'sha256:" in err and "start afresh in a new --output-dir" in err


def test_a_token_cache_of_another_corpus_with_the_same_name_is_not_reused(prepared, tmp_path, capsys):
    a, b = corpus(tmp_path / "a" / "corpus.txt", 1), corpus(tmp_path / "b" / "corpus.txt", 3)
    out = tmp_path / "run"
    base = ("--steps", "2", "--save-model", "False", "--checkpoint-every", "-1", "--resume", "False")
    assert ftrain.main(argv(*base, "--data", str(a), "--output-dir", str(out))) == 0
    first = json.loads((out / "data" / "manifest.json").read_text())["source"]
    assert first["sha256"] == fdata.source_digest([a])
    (out / "summary.json").unlink()  # the first run put aside (a completed run is never started over: test_shared_folders)
    assert ftrain.main(argv(*base, "--data", str(b), "--output-dir", str(out))) == 0
    second = json.loads((out / "data" / "manifest.json").read_text())["source"]
    assert second["files"] == first["files"] == ["corpus.txt"] and second["sha256"] == fdata.source_digest([b])
    assert second["sha256"] != first["sha256"]


# ------------------------------------------------------------------------------ 6. faults

def test_ctrl_c_writes_a_checkpoint_and_a_summary(prepared, tmp_path):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "fp8lab.train", *argv("--steps", "100000", "--save-model", "False",
                                                        "--data", str(prepared), "--output-dir", str(out))]
    code, stdout, stderr = interrupt_after(cmd, ENV, out / "metrics.jsonl", steps=3)
    assert code == 0 and "KeyboardInterrupt" not in stderr, stderr[-2000:]
    step = int(stdout.split("SIGINT received: checkpoint written at step ")[1].split(";")[0])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == step
    assert (out / "checkpoints" / f"step_{step:08d}" / fckpt.MANIFEST).is_file()


def test_a_summary_that_cannot_be_written_is_exit_4_and_the_old_one_stays_whole(prepared, tmp_path, monkeypatch, capsys):
    from fp8lab.records import ownership

    out = tmp_path / "run"
    base = argv("--save-model", "False", "--data", str(prepared), "--output-dir", str(out))
    assert ftrain.main(base + ["--steps", "2"]) == 0
    old = (out / "summary.json").read_bytes()
    real = ownership.write_file

    def full_disk(path, data):  # the next write of the summary meets a full disk (a real one: the ulimit test below)
        if Path(path).name == "summary.json":
            raise OSError(28, "No space left on device")
        return real(path, data)

    monkeypatch.setattr(ownership, "write_file", full_disk)
    capsys.readouterr()
    assert ftrain.main(base + ["--steps", "3", "--resume-with-new-settings"]) == ftrain.EXIT_CHECKPOINT_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("fp8lab: writing summary.json in 'run' failed (OSError: [Errno 28] No space left on device")
    assert (out / "summary.json").read_bytes() == old and not list(out.glob(ownership.TMP_PREFIX + "*"))
    assert [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] == [1, 2, 3]


def test_a_failed_export_keeps_the_weights_and_a_rerun_exports_them(prepared, tmp_path, monkeypatch, capsys):
    from transformers import PreTrainedModel

    out = tmp_path / "run"
    args = argv("--steps", "2", "--checkpoint-every", "-1", "--data", str(prepared), "--output-dir", str(out))
    real = PreTrainedModel.save_pretrained

    def full_disk(self, *a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    capsys.readouterr()
    assert ftrain.main(args) == ftrain.EXIT_CHECKPOINT_FAILED
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "exporting the model to --model-dir 'model' failed (OSError: [Errno 28] No space left on device" in last
    assert "kept in checkpoint step_00000002 of --checkpoint-dir 'checkpoints'" in last
    assert json.loads((out / "summary.json").read_text())["status"] == "export_failed"
    assert not any(p.name != ".fp8lab-owner.json" for p in (out / "model").iterdir())  # nothing half-written
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", real)
    assert ftrain.main(args) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["val_loss"] is not None and summary["model_dir"] == "model"
    assert (out / "model" / "model.safetensors").is_file() and (out / "model" / "tokenizer.json").is_file()


def test_a_finished_run_re_run_keeps_its_summary(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    args = argv("--steps", "2", "--save-model", "False", "--data", str(prepared), "--output-dir", str(out))
    assert ftrain.main(args) == 0
    before = tree(out)
    assert json.loads((out / "summary.json").read_text())["val_loss"] is not None
    capsys.readouterr()
    assert ftrain.main(args) == 0
    assert "is complete (step 2 of 2)" in capsys.readouterr().out
    assert tree(out) == before  # summary.json, config.json, metrics.jsonl, checkpoints: as they were


# ------------------------------------------------------------------------------ 7. links, lookalikes, a full disk (issue 50)

def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    v = tmp_path / name
    v.write_text("years of work\n")
    return v


@pytest.mark.parametrize("plant", ["symlink", "hardlink", "fifo"])
def test_a_planted_run_lock_is_never_written_through(prepared, tmp_path, plant, capsys):
    from fp8lab.records import runlock

    out = tmp_path / "o"
    out.mkdir()
    victim = _victim(tmp_path)
    lock = out / ".fp8lab-lock"
    {"symlink": lambda: lock.symlink_to(Path("..") / victim.name), "hardlink": lambda: os.link(victim, lock),
     "fifo": lambda: os.mkfifo(lock)}[plant]()
    before = tree(tmp_path)
    err = refused(argv("--steps", "2", "--data", str(prepared), "--output-dir", str(out)), capsys)
    assert "holds files fp8lab did not write (.fp8lab-lock)" in err
    with pytest.raises(ValueError, match="holds a .fp8lab-lock that fp8lab cannot use as its run lock"):
        runlock.acquire("--output-dir", out)  # the lock itself, called directly, refuses too (and never blocks)
    assert tree(tmp_path) == before and victim.read_text() == "years of work\n"


@pytest.mark.parametrize("name", [".fp8lab-owner.json.tmp", "summary.json.tmp", "metrics.jsonl.tmp", "config.json.tmp"])
def test_a_planted_temporary_file_link_is_never_written_through(prepared, tmp_path, name, capsys):
    from fp8lab.records import ownership

    victim = _victim(tmp_path)
    out = tmp_path / "o"
    out.mkdir()
    (out / name).symlink_to(Path("..") / victim.name)
    err = refused(argv("--steps", "2", "--data", str(prepared), "--output-dir", str(out)), capsys)
    assert f"holds files fp8lab did not write ({name})" in err  # a *.tmp name is not fp8lab's for its name
    ownership.claim(out, "run")  # marking the folder writes a fresh temporary file, never the planted link
    ownership.write_file(out / "summary.json", "{}\n")
    assert victim.read_text() == "years of work\n" and (out / name).is_symlink()
    assert ownership.marker_kind(out) == "run" and not list(out.glob(ownership.TMP_PREFIX + "*"))


def test_checkpoint_rotation_never_deletes_the_users_step_folders(prepared, tmp_path, capsys):
    ck = tmp_path / "ck"
    for step in (1, 2):
        (ck / f"step_{step:08d}").mkdir(parents=True)
        (ck / f"step_{step:08d}" / "notes.txt").write_text(f"my own step {step}\n")
    before = tree(ck)
    base = ("--steps", "4", "--checkpoint-every", "1", "--save-model", "False", "--data", str(prepared))
    err = refused(argv(*base, "--output-dir", str(tmp_path / "o"), "--checkpoint-dir", str(ck)), capsys)
    assert "--checkpoint-dir=" in err and "holds files fp8lab did not write (step_00000001, step_00000002)" in err
    assert tree(ck) == before
    # a user's DCP checkpoints of these names (no fp8lab manifest): never replaced, never rotated away
    import shutil

    shutil.rmtree(ck / "step_00000002")
    mine = ck / "step_00000001"
    (mine / "notes.txt").unlink()
    (mine / ".metadata").write_bytes(b"their metadata")
    (mine / "__0_0.distcp").write_bytes(b"their shards")
    before = tree(ck)
    err = refused(argv(*base, "--output-dir", str(tmp_path / "o"), "--checkpoint-dir", str(ck)), capsys)
    assert "holds step_00000001, not written by fp8lab, where this run of 4 steps may save its own" in err  # at the start
    assert {k: v for k, v in tree(ck).items() if k.startswith("step_00000001/")} == before
    mine.rename(ck / "step_00000009")
    before = {k: v for k, v in tree(ck).items() if k.startswith("step_00000009/")}
    assert ftrain.main(argv(*base, "--output-dir", str(tmp_path / "o2"), "--checkpoint-dir", str(ck))) == 0
    assert sorted(p.name for p in ck.iterdir() if p.name.startswith("step_")) == ["step_00000003", "step_00000004",
                                                                                   "step_00000009"]
    assert {k: v for k, v in tree(ck).items() if k.startswith("step_00000009/")} == before


def test_the_export_never_replaces_model_files_fp8lab_did_not_write(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    base = argv("--steps", "2", "--checkpoint-every", "-1", "--resume", "False", "--data", str(prepared), "--output-dir", str(out))
    assert ftrain.main(base + ["--save-model", "False"]) == 0  # an fp8lab run folder, no export yet
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text('{"mine": true}\n')
    (out / "model" / "model.safetensors").write_bytes(b"my weights")
    before = tree(tmp_path)
    err = refused(base + ["--save-model", "True"], capsys)
    assert "--model-dir=" in err and "holds files fp8lab did not write (config.json, model.safetensors)" in err
    assert tree(tmp_path) == before
    # a file fp8lab exported, then edited by the user: no longer fp8lab's bytes, so never replaced either
    (out / "model" / "config.json").unlink()
    (out / "model" / "model.safetensors").unlink()
    (out / "summary.json").unlink()  # the first run put aside (a completed run is never started over: test_shared_folders)
    assert ftrain.main(base + ["--save-model", "True"]) == 0
    (out / "model" / "generation_config.json").write_text('{"edited": "by hand"}\n')
    err = refused(base + ["--save-model", "True", "--steps", "3"], capsys)
    assert "holds files fp8lab did not write (generation_config.json)" in err
    assert (out / "model" / "generation_config.json").read_text() == '{"edited": "by hand"}\n'


def test_a_lookalike_run_folder_keeps_the_users_metrics(prepared, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"command": "fp8lab train --steps 9"}))  # says fp8lab, is not
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0, "mine": true}\n')
    before = tree(tmp_path)
    err = refused(argv("--steps", "2", "--data", str(prepared), "--output-dir", str(out)), capsys)
    assert "holds files fp8lab did not write (config.json, metrics.jsonl)" in err
    assert tree(tmp_path) == before
    # a hand-made marker does not make the user's files fp8lab's either
    (out / ".fp8lab-owner.json").write_text(json.dumps({"written_by": "fp8lab", "kind": "run"}))
    before = tree(tmp_path)
    err = refused(argv("--steps", "2", "--data", str(prepared), "--output-dir", str(out)), capsys)
    assert "holds files fp8lab did not write (config.json, metrics.jsonl)" in err and tree(tmp_path) == before


def test_prepare_data_never_replaces_files_under_a_hand_made_tokens_marker(tmp_path, capsys):
    out = tmp_path / "tokens"
    out.mkdir()
    (out / ".fp8lab-owner.json").write_text(json.dumps({"written_by": "fp8lab", "kind": "tokens"}))
    (out / "train_00000.bin").write_bytes(b"my measurements")
    (out / "manifest.json").write_text(json.dumps({"format": "fp8lab-tokens", "version": 1, "mine": True}))
    before = tree(tmp_path)
    assert run_data.main([str(out), "--source", str(corpus(tmp_path / "src" / "a.txt", 1)), "--vocab-size", "512"]) == 2
    err = capsys.readouterr().err
    assert "OUT_DIR=" in err and "holds files fp8lab did not write (manifest.json, train_00000.bin)" in err
    assert {k: v for k, v in tree(tmp_path).items() if k.startswith("tokens/")} == \
        {k: v for k, v in before.items() if k.startswith("tokens/")}


@pytest.mark.parametrize("target", ["res/x/a.jsonl", "res/x", "res/x/b.csv"])
def test_report_never_writes_over_one_of_its_inputs(tmp_path, monkeypatch, target, capsys):
    from fp8lab.views import report

    from fake_runs import bench  # a result file as the benchmarks write one

    monkeypatch.chdir(tmp_path)
    bench(tmp_path / "res" / "x", "a", 1000.0, 1, "2026-12-01T00:00:00Z")
    before = tree(tmp_path)
    code = report.main(["res/x", "--out", target])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert (f"--out={target!r} is one of the run files the report reads" in err
            or f"--out={target!r} is a folder" in err), err
    assert tree(tmp_path) == before
    assert report.main(["res/x", "--markdown", "res/x/a.jsonl", "--out", "r.html"]) == 2
    assert "--markdown='res/x/a.jsonl' is one of the run files" in capsys.readouterr().err
    with pytest.raises(ValueError, match="out='res/x/a.jsonl' is one of the run files"):
        report.build_report("res/x/a.jsonl", "res/x/a.jsonl")
    assert tree(tmp_path) == before


def test_a_full_disk_at_the_export_is_exit_4_with_safetensors_error_and_a_summary(prepared, tmp_path):
    """A real file-size limit (``ulimit -f``): safetensors' own error is caught like an OSError."""
    import resource

    out = tmp_path / "run"
    limit = 2 << 20  # bytes per file: the run's small files fit, a 512-wide 8-layer model's weights do not

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    cmd = [sys.executable, "-m", "fp8lab.train", *argv("--steps", "2", "--checkpoint-every", "-1",
           "--model-override", "hidden_size=512", "--model-override", "num_layers=8", "--data", str(prepared),
           "--output-dir", str(out))]
    proc = subprocess.run(cmd, env={**ENV, "PYTHONPATH": str(REPO_ROOT)}, capture_output=True, text=True, timeout=600,
                          preexec_fn=small_files)
    assert proc.returncode == ftrain.EXIT_CHECKPOINT_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fp8lab: exporting the model to --model-dir") and "(SafetensorError: " in last, last
    assert "File too large" in last  # safetensors' own words
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "export_failed" and summary["message"] == last and summary["steps"] == 2
    assert [p.name for p in (out / "model").iterdir()] == [".fp8lab-owner.json"]  # nothing half-written
    assert not list(out.rglob(".fp8lab-tmp-*"))


def test_a_relative_output_dir_is_echoed_as_given(prepared, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("rel").mkdir()
    Path("rel/notes.txt").write_text("mine\n")
    err = refused(argv("--steps", "2", "--data", str(prepared), "--output-dir", "rel"), capsys)
    assert "--output-dir='rel' holds files fp8lab did not write (notes.txt)" in err and str(tmp_path) not in err
