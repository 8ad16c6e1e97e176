"""Nothing lost when runs share folders, disks fill or Ctrl-C lands late: the fourth hostile probe's cases that train
(tiny Llama on the CPU, real processes, real signals, ``ulimit -f`` as the small disk).
"""
from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from refusals import refused  # tests/helpers
from fp8lab.core.paths import REPO_ROOT
from fp8lab.data import tokens as fdata
from fp8lab.data import run_data
from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.train import checkpoint as fckpt
from fp8lab.train import entry as ftrain

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
       "HF_HUB_OFFLINE": "1"}


def argv(*extra: str) -> list[str]:
    return ["--model", "llama-tiny", "--seq-len", "32", "--micro-batch-size", "2", "--compute-dtype", "fp32",
            "--progress", "off", "--plot", "False", "--print-metrics", "False", *extra]


def start(args: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "fp8lab.train", *args], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def wait_for_steps(out: Path, n: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if (out / "metrics.jsonl").exists() and len(fmetrics.read_metrics(out / "metrics.jsonl")) >= n:
            return
        time.sleep(0.1)
    raise AssertionError(f"no {n} steps in {out} (exit {proc.poll()})")


def finish(proc: subprocess.Popen, sig: int | None = signal.SIGTERM) -> tuple[str, str]:
    try:
        if sig is not None and proc.poll() is None:
            proc.send_signal(sig)
        return proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()


def file_limit(limit: int):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def steps_in(ck: Path) -> list[str]:
    return sorted(p.name for p in ck.iterdir() if p.name.startswith("step_"))


# ------------------------------------------------------------------------------------ data loss

def test_two_runs_sharing_a_checkpoint_folder_the_second_is_refused_and_the_first_keeps_its_own(prepared, tmp_path, capsys):
    ck = tmp_path / "ck"
    common = ("--steps", "100000", "--checkpoint-every", "1", "--save-model", "False", "--data", str(prepared),
              "--checkpoint-dir", str(ck))
    first = start(argv(*common, "--output-dir", str(tmp_path / "a")))
    try:
        wait_for_steps(tmp_path / "a", 2, first)
        err = refused(argv(*common, "--seed", "7", "--output-dir", str(tmp_path / "b")), capsys)
        assert f"--checkpoint-dir={str(ck)!r} is in use by another fp8lab run (pid {first.pid} on " in err
        assert not (tmp_path / "b").exists()  # a refused run leaves nothing
    finally:
        stdout, stderr = finish(first)
    assert first.returncode == 0, stderr[-2000:]
    step = int(stdout.split("checkpoint written at step ")[1].split(";")[0])
    assert f"step_{step:08d}" in steps_in(ck) and all(ownership.own_checkpoint(ck / s) for s in steps_in(ck))
    # the same command resumes from the first run's own checkpoint (nothing of it was rotated away by another run)
    again = start(argv(*common, "--output-dir", str(tmp_path / "a")))
    try:
        wait_for_steps(tmp_path / "a", step + 1, again)
    finally:
        stdout, stderr = finish(again)
    assert again.returncode == 0, stderr[-2000:]
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["resumed_from_step"] == step


def test_another_jobs_step_folders_are_refused_at_the_start_and_kept(prepared, tmp_path, capsys):
    ck = tmp_path / "ck"
    shards = ck / "step_00000001"  # a node's share of another job's checkpoint: shards only
    shards.mkdir(parents=True)
    (shards / "__0_0.distcp").write_bytes(b"another job's shards")
    base = ("--steps", "4", "--checkpoint-every", "1", "--save-model", "False", "--data", str(prepared),
            "--checkpoint-dir", str(ck))
    err = refused(argv(*base, "--output-dir", str(tmp_path / "o")), capsys)
    assert "holds step_00000001, not written by fp8lab, where this run of 4 steps may save its own" in err
    assert (shards / "__0_0.distcp").read_bytes() == b"another job's shards"
    # another tool's complete checkpoint of a step the run would reach: refused now, not at the final save
    shards.rename(ck / "step_00000009")
    other = ck / "step_00000002"
    other.mkdir()
    (other / ".metadata").write_bytes(b"their metadata")
    (other / "__0_0.distcp").write_bytes(b"their shards")
    err = refused(argv(*base, "--output-dir", str(tmp_path / "o")), capsys)
    assert "holds step_00000002, not written by fp8lab" in err
    shutil.rmtree(other)
    # past the run's last step: kept and never rotated (only folders with fp8lab's manifest are)
    assert ftrain.main(argv(*base, "--output-dir", str(tmp_path / "o"))) == 0
    assert steps_in(ck) == ["step_00000003", "step_00000004", "step_00000009"]
    assert ((ck / "step_00000009") / "__0_0.distcp").read_bytes() == b"another job's shards"


def test_a_completed_run_is_never_replaced_by_a_fresh_start_or_another_runs_export(prepared, tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    base = ("--steps", "2", "--checkpoint-every", "-1", "--data", str(prepared))
    assert ftrain.main(argv(*base, "--output-dir", str(a))) == 0
    kept = {p: p.read_bytes() for p in (a / "metrics.jsonl", a / "summary.json", a / "model" / "model.safetensors")}
    err = refused(argv(*base, "--resume", "False", "--seed", "9", "--output-dir", str(a)), capsys)
    assert f"--output-dir={str(a)!r} holds a completed run (its metrics.jsonl, summary.json and model)" in err
    assert "with --resume False would replace them; allowed: a new --output-dir" in err
    err = refused(argv(*base, "--output-dir", str(a)), capsys)  # nothing to resume: the same
    assert "with no checkpoint to resume from" in err
    err = refused(argv(*base, "--seed", "9", "--output-dir", str(b), "--model-dir", str(a / "model")), capsys)
    assert f"--model-dir={str(a / 'model')!r} holds the model another run exported" in err
    assert {p: p.read_bytes() for p in kept} == kept and not b.exists()
    # fp8lab's own refusal for another model in a checkpoint folder no longer recommends --resume False
    cked = tmp_path / "c"
    assert ftrain.main(argv("--steps", "2", "--save-model", "False", "--data", str(prepared), "--output-dir", str(cked))) == 0
    err = refused(argv("--steps", "2", "--save-model", "False", "--seed", "5", "--data", str(prepared),
                       "--output-dir", str(cked)), capsys)
    assert "written by a different run" in err and "--resume False" not in err and "a new --output-dir" in err


# ------------------------------------------------------------------------------------ full disks, Ctrl-C

def test_a_checkpoint_that_does_not_fit_is_reported_and_leaves_no_partial_folder(prepared, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fp8lab.train", *argv(
        "--steps", "3", "--checkpoint-every", "2", "--save-model", "False", "--data", str(prepared),
        "--output-dir", str(out))], env=ENV, capture_output=True, text=True, timeout=600,
        preexec_fn=file_limit(1 << 20))  # the run's files fit; a checkpoint's 2 MB of shards does not
    assert proc.returncode == ftrain.EXIT_CHECKPOINT_FAILED, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fp8lab: stopped at step 2: writing its checkpoint to --checkpoint-dir 'checkpoints' "
                           "failed (") and "resumes from the start (no complete checkpoint)" in last, last
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "checkpoint_failed" and summary["message"] == last
    assert str(tmp_path) not in (out / "summary.json").read_text()  # no machine path in what is shared
    assert steps_in(out / "checkpoints") == []  # the half-written step_00000002.tmp is gone


@pytest.mark.parametrize("limit, name", [(3000, "config.json"), (9000, "metrics.jsonl")])
def test_a_file_size_limit_on_the_runs_own_files_is_one_line(prepared, tmp_path, limit, name):
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "fp8lab.train", *argv(
        "--steps", "60", "--checkpoint-every", "-1", "--save-model", "False", "--data", str(prepared),
        "--output-dir", str(out))], env=ENV, capture_output=True, text=True, timeout=600, preexec_fn=file_limit(limit))
    assert proc.returncode == ftrain.EXIT_CHECKPOINT_FAILED, proc.stderr[-3000:]
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith(f"fp8lab train: error: OSError: File too large ({name}); stopped; the files written so far "
                          "are kept"), err
    assert str(tmp_path) not in err


def test_ctrl_c_twice_in_training_is_one_line_and_the_same_command_resumes(prepared, tmp_path):
    out = tmp_path / "run"
    # steps of a second or so, so the second Ctrl-C lands inside the step the first one asked to end
    cmd = argv("--steps", "100000", "--checkpoint-every", "1", "--save-model", "False", "--model-override",
               "hidden_size=512", "--model-override", "num_layers=8", "--data", str(prepared), "--output-dir", str(out))
    proc = start(cmd)
    try:
        wait_for_steps(out, 3, proc)
        proc.send_signal(signal.SIGINT)
        time.sleep(0.2)  # two signals at once are one to Python: the first is handled before the second comes
        proc.send_signal(signal.SIGINT)  # the second, before the first's checkpoint: stop at once
    finally:
        stdout, stderr = finish(proc, None)
    assert proc.returncode == ftrain.EXIT_INTERRUPTED, stderr[-3000:]
    err = stderr.strip()
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.splitlines()[-1]
    assert last.startswith("fp8lab train: interrupted (Ctrl-C); the files written so far and checkpoint step_") and \
        "the same command resumes from step" in last, last
    step = int(last.split("resumes from step ")[1])
    first = os.stat(out / "metrics.jsonl").st_ino  # the resumed run writes its metrics.jsonl anew (a new file)
    again = start(cmd)
    resumed = None
    try:
        deadline = time.time() + 300
        while time.time() < deadline and again.poll() is None and os.stat(out / "metrics.jsonl").st_ino == first:
            time.sleep(0.1)
        wait_for_steps(out, step + 1, again)
    except AssertionError as exc:
        resumed = str(exc)
    finally:
        stdout, stderr = finish(again)
    assert resumed is None, f"{resumed}; the first run said: {last}; the resumed run said: {stderr[-3000:]}; " \
        f"checkpoints: {sorted(p.name for p in (out / 'checkpoints').iterdir())}"
    assert again.returncode == 0, stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["resumed_from_step"] == step
    assert not list((out / "checkpoints").glob("*.tmp"))


HELD_EXPORT = """
import runpy, time
from fp8lab.records import ownership
claim = ownership.claim
def held(folder, kind, *a, **k):
    out = claim(folder, kind, *a, **k)
    if kind == "model":
        time.sleep(30)
    return out
ownership.claim = held
runpy.run_module("fp8lab.train", run_name="__main__")
"""


@pytest.mark.parametrize("sig,name,code", [(signal.SIGINT, "Ctrl-C", ftrain.EXIT_INTERRUPTED),
                                           (signal.SIGTERM, "SIGTERM", 128 + signal.SIGTERM)])
def test_ctrl_c_during_the_export_is_one_line_and_the_same_command_exports(prepared, tmp_path, sig, name, code):
    out = tmp_path / "run"
    cmd = argv("--steps", "2", "--data", str(prepared), "--output-dir", str(out))
    # the trainer as `python -m fp8lab.train` runs it, its export held for a while once it has claimed the model
    # folder: the signal lands inside the export whatever the machine's load (a real export's window is a few
    # hundredths of a second, which a busy machine's poll can miss)
    # with Ctrl-C's default action, as a terminal gives it: tests started in the background by a non-interactive
    # shell ignore SIGINT, and a child inherits that (Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen([sys.executable, "-c", HELD_EXPORT, *cmd], env=ENV, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None and not (out / "model" / ownership.MARKER).exists():
            time.sleep(0.01)  # the export claims its folder first, then writes the weights
        proc.send_signal(sig)
    finally:
        stdout, stderr = finish(proc, None)
    assert proc.returncode == code, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert "Traceback" not in stderr and last == (f"fp8lab train: interrupted ({name}); the files written so far and "
                                                  "checkpoint step_00000002 are kept: the same command resumes from step 2")
    assert not (out / "model" / "model.safetensors").exists() and not list(out.rglob(ownership.TMP_PREFIX + "*"))
    done = subprocess.run([sys.executable, "-m", "fp8lab.train", *cmd], env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "model" / "model.safetensors").is_file()
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


# ------------------------------------------------------------------------------------ shared data, wrong results

def test_prepare_data_into_the_data_of_a_running_training_is_refused(prepared, tmp_path, capsys):
    data = tmp_path / "tokens"
    before = fdata.prepare_data(None, data, None, vocab_size=512)
    out = tmp_path / "run"
    proc = start(argv("--steps", "100000", "--checkpoint-every", "-1", "--save-model", "False", "--data", str(data),
                      "--output-dir", str(out)))
    try:
        wait_for_steps(out, 2, proc)
        assert run_data.main([str(data), "--vocab-size", "512"]) == 2
        err = capsys.readouterr().err.strip()
        assert f"OUT_DIR={str(data)!r} is in use by another fp8lab prepare-data (a training run reads it)" in err, err
    finally:
        stdout, stderr = finish(proc)
    assert proc.returncode == 0, stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert fdata.read_manifest(data) == before  # the shards it read stayed as they were


def test_a_run_whose_every_step_was_skipped_is_not_completed(prepared, tmp_path, capsys):
    out = tmp_path / "run"
    code = ftrain.main(argv("--study", "--steps", "2", "--inject-nan-at-steps", "1,2", "--max-bad-steps", "5",
                            "--data", str(prepared), "--output-dir", str(out)))
    err = capsys.readouterr().err
    assert code == ftrain.EXIT_OVERFLOW, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "stopped_nonfinite" and "all 2 steps had a non-finite loss" in summary["message"]
    assert not (out / "model" / "model.safetensors").exists()


def test_the_export_ships_the_tokenizer_training_used_with_one_file_mode(prepared, tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "mine"
    LlamaForCausalLM(LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)).save_pretrained(folder)
    shutil.copyfile(fdata.shipped_tokenizer_path(32000), folder / "tokenizer.json")  # maps ids otherwise than --data's
    out = tmp_path / "run"
    capsys.readouterr()
    assert ftrain.main(argv("--model", str(folder), "--steps", "2", "--data", str(prepared), "--output-dir", str(out))) == 0
    said = capsys.readouterr().out
    assert "--model's tokenizer maps tokens to other ids than --data's" in said
    shipped = out / "model" / "tokenizer.json"
    assert shipped.read_bytes() != (folder / "tokenizer.json").read_bytes()
    from tokenizers import Tokenizer

    assert Tokenizer.from_file(str(shipped)).get_vocab() == Tokenizer.from_file(str(prepared / "tokenizer.json")).get_vocab()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (out / "model").iterdir() if not p.name.startswith(".")}
    assert modes["model.safetensors"] == modes["config.json"] and len(set(modes.values())) == 1, modes
