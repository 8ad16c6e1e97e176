"""Nothing fp8lab did not write is replaced, no write goes over a device or a FIFO, every option is bounded where it
is parsed, and a full disk or a file-size limit is one line (the fourth hostile probe's cases that take seconds).

Real processes hold the locks (a second Python process, as a second run would), real FIFOs and device nodes stand
where fp8lab writes, and ``ulimit -f`` (RLIMIT_FSIZE, set in the child before it starts) is the small disk.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp8lab import notebooks as nb
from fp8lab.core.paths import REPO_ROOT, shareable_text
from fp8lab.data import tokens as fdata
from fp8lab.data import run_data
from fp8lab.records import ownership, runlock
from fp8lab.train import checkpoint as fckpt
from fp8lab.train import entry as ftrain
from fp8lab.train.components import StepMetrics
from fp8lab.train.resume import failure_reason
from fp8lab.views import report

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_limit(limit: int):
    """A child's ``ulimit -f``: no file it writes grows past ``limit`` bytes (Python ignores SIGXFSZ: an OSError)."""
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


def holder(folder: Path, shared: bool = False) -> subprocess.Popen:
    """Another process holding fp8lab's lock on ``folder`` (a running run, or a training run reading its --data)."""
    call = f"runlock.acquire_shared('--data', {str(folder)!r})" if shared else f"runlock.acquire('X', {str(folder)!r})"
    code = f"from fp8lab.records import runlock\nlock = {call}\nprint('held', flush=True)\nimport time; time.sleep(120)\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def corpus(folder: Path, docs: int = 200) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    words = ["light", "water", "stone", "field", "river", "bread", "house", "night"]
    text = "\n\n".join(" ".join(words[(i + j) % len(words)] for j in range(60)) + "." for i in range(docs))
    (folder / "corpus.txt").write_text(text + "\n")
    return folder / "corpus.txt"


# ------------------------------------------------------------------------------------ writes never replace

def test_a_write_never_replaces_a_fifo_a_device_or_a_folder(tmp_path):
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match="is a device, FIFO or socket, not a file fp8lab may replace"):
        ownership.write_file(fifo, "x")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "d").mkdir()
    with pytest.raises(FileExistsError, match="is a folder"):
        ownership.write_file(tmp_path / "d", "x")
    assert not list(tmp_path.glob(ownership.TMP_PREFIX + "*"))  # nothing left beside them


def _device(tmp_path: Path) -> Path:
    """A character device like /dev/null, made where the test may lose it (root only)."""
    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (containers and SageMaker run as root, where it matters)")
    return dev


def test_report_out_at_a_device_a_fifo_or_a_users_file_is_refused_before_reading(tmp_path, capsys):
    dev = _device(tmp_path)
    fifo = tmp_path / "fifo.html"
    os.mkfifo(fifo)
    mine = tmp_path / "notes.html"
    mine.write_text("<p>my notes</p>\n")
    for target, words in ((dev, "is a device, FIFO or socket"), (fifo, "is a device, FIFO or socket"),
                          (mine, "exists and is not a report fp8lab wrote")):
        assert report.main([str(tmp_path / "nothing-read"), "--out", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"fp8lab report: error: --out={str(target)!r} {words}") and len(err.splitlines()) == 1, err
    assert stat.S_ISCHR(os.lstat(dev).st_mode) and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert mine.read_text() == "<p>my notes</p>\n"


def test_report_never_replaces_the_checkouts_readme_nor_its_page_with_the_table(tmp_path, capsys):
    readme = REPO_ROOT / "README.md"
    before = digest(readme)
    assert report.main(["--out", str(readme)]) == 2
    assert "exists and is not a report fp8lab wrote" in capsys.readouterr().err
    assert report.main(["--markdown", str(readme)]) == 2
    assert "--markdown=" in capsys.readouterr().err
    assert digest(readme) == before
    page = tmp_path / "r.html"
    assert report.main(["--out", str(page), "--markdown", str(page)]) == 2
    err = capsys.readouterr().err
    assert "name one file; the table would replace the page" in err and not page.exists()


def _bare_runs(root: Path) -> Path:
    """Two trainer folders holding only metrics.jsonl (a documented input): no config, no GPU named."""
    for name, precision in (("a", "bf16"), ("b", "fp8")):
        (root / name).mkdir(parents=True)
        with open(root / name / "metrics.jsonl", "w") as fh:
            for i in range(1, 13):
                fh.write(json.dumps({"step": i, "loss": 5.0 - 0.1 * i, "tokens": i * 100, "step_time_s": 0.1,
                                     "tokens_per_sec": 1000.0, "tokens_per_sec_per_gpu": 1000.0,
                                     "precision": precision, "model": "m", "world_size": 1}) + "\n")
    return root


def test_a_report_of_bare_metrics_files_is_written_and_rewritten(tmp_path, capsys):
    runs = _bare_runs(tmp_path / "runs")
    page, table = tmp_path / "report.html", tmp_path / "table.md"
    assert report.main([str(runs), "--out", str(page), "--markdown", str(table)]) == 0, capsys.readouterr().err
    assert report.GENERATOR_META in page.read_text()
    # a page and a table fp8lab wrote are its own: the same command replaces them
    assert report.main([str(runs), "--out", str(page), "--markdown", str(table)]) == 0, capsys.readouterr().err


def test_a_report_under_a_file_size_limit_is_one_line_and_the_old_page_stays(tmp_path):
    runs = _bare_runs(tmp_path / "runs")
    page = tmp_path / "report.html"
    page.write_text("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + report.GENERATOR_META + "old\n")
    before = page.read_text()
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "report", str(runs), "--out", str(page)], env=ENV,
                          capture_output=True, text=True, timeout=300, preexec_fn=file_limit(20_000))
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fp8lab report: error: File too large") and "a page written before stays as it was" in err
    assert page.read_text() == before and not list(tmp_path.glob(ownership.TMP_PREFIX + "*"))


# ------------------------------------------------------------------------------------ notebooks

def test_notebooks_run_never_writes_over_a_users_notebook_or_the_tutorials_source(tmp_path):
    out = tmp_path / "work"
    out.mkdir()
    mine = out / "01_fp8_formats.ipynb"
    mine.write_text('{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}\n')
    before = mine.read_text()
    with pytest.raises(ValueError, match="holds 01_fp8_formats.ipynb, which is not a copy fp8lab notebooks executed"):
        nb.run(["01"], output_dir=out, progress=False)
    assert mine.read_text() == before and not (out / ".fp8lab-lock").exists()
    source = nb.resolve(["01"])[0]
    before = digest(source)
    with pytest.raises(ValueError, match="holds the notebook 01_fp8_formats.ipynb itself"):
        nb.run(["01"], output_dir=source.parent, progress=False)
    assert digest(source) == before


def test_two_notebook_runs_into_one_folder_the_second_is_refused(tmp_path):
    out = tmp_path / "work"
    out.mkdir()
    first = holder(out)  # a runner at work in that folder (the same lock a run takes)
    try:
        with pytest.raises(ValueError, match=f"--output-dir={str(out)!r} is in use by another fp8lab notebooks run "
                                             f"\\(pid {first.pid} on "):
            nb.run(["01"], output_dir=out, progress=False)
    finally:
        first.kill()
        first.wait()


def test_an_executed_notebooks_outputs_name_no_absolute_folder(tmp_path):
    import nbformat

    source = nb.resolve(["02"])[0]
    out = tmp_path / "outputs"
    work = out / source.stem
    work.mkdir(parents=True)
    book = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("run_dir")
    cell.outputs = [nbformat.v4.new_output("execute_result", {"text/plain": f"PosixPath('{work.resolve()}/runs/a')"},
                                           execution_count=1),
                    nbformat.v4.new_output("stream", text=f"wrote {out.resolve()}/x.png and {REPO_ROOT}/data\n")]
    book.cells = [cell]
    book.metadata["papermill"] = {"input_path": str(source), "output_path": str(out / source.name), "parameters": {}}
    nbformat.write(book, str(out / source.name))
    nb._shareable_metadata(out / source.name, source)  # what the runner does after each notebook
    text = (out / source.name).read_text()
    assert str(tmp_path) not in text and str(REPO_ROOT) not in text
    outputs = json.loads(text)["cells"][0]["outputs"]
    assert "".join(outputs[0]["data"]["text/plain"]) == "PosixPath('./runs/a')"
    assert "".join(outputs[1]["text"]) == "wrote ../x.png and <abs>/data\n"


# ------------------------------------------------------------------------------------ options bounded where parsed

@pytest.mark.parametrize("option, value, allowed", [
    ("--val-batches", "1e30", "at most 100,000"), ("--grad-accum", "1e30", "at most 100,000"),
    ("--weight-decay", "1e30", "a number in [0, 1]"),
    ("--seed", "1e30", "2**32 - 1"), ("--seed", "99999999999999999999", "2**32 - 1"),
    ("--peak-tflops", "1e30", "TFLOP/s of one GPU"), ("--gpu-memory-gib", "1e30", "GiB of one GPU"),
    ("--output-dir", " ", "a non-empty path"), ("--output-dir", "", "a non-empty path"),
])
def test_every_probed_option_is_bounded_with_its_name(option, value, allowed, capsys):
    code = ftrain.main(["--dry-run", "--steps", "2", option, value])
    err = capsys.readouterr().err.strip()
    assert code == ftrain.EXIT_BAD_OPTIONS and len(err.splitlines()) == 1, err
    assert err.startswith(f"fp8lab train: error: {option}=") and allowed in err and "Overflow" not in err, err


def test_a_fifo_at_the_results_index_does_not_block_launch_plan(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for entry in (REPO_ROOT / "data").iterdir():
        if entry.name != "results-index.json":
            (data / entry.name).symlink_to(entry)
    os.mkfifo(data / "results-index.json")
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "launch", "plan"], env={**ENV, "FP8LAB_DATA_DIR": str(data)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "results-index.json is unreadable or of another format" in proc.stderr
    assert stat.S_ISFIFO(os.lstat(data / "results-index.json").st_mode)


# ------------------------------------------------------------------------------------ checkpoint folders

def test_a_step_folder_of_shards_without_fp8labs_manifest_is_another_jobs(tmp_path):
    theirs = tmp_path / "step_00000001"
    theirs.mkdir()
    (theirs / "__0_0.distcp").write_bytes(b"another job's shards")
    assert not ownership.own_checkpoint(theirs)
    assert fckpt.foreign_steps(tmp_path, 4) == ["step_00000001"] and fckpt.foreign_steps(tmp_path, 0) == []
    tmp = tmp_path / "step_00000002.tmp"  # the same, cut short: another job's unless fp8lab's manifest is there
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"half")
    assert fckpt.remove_partial(tmp_path) == [] and tmp.is_dir()
    fckpt._write_manifest(tmp, 2, pending=True)  # what a save writes first
    assert ownership.own_checkpoint(tmp) and fckpt.remove_partial(tmp_path) == [tmp] and not tmp.exists()
    assert (theirs / "__0_0.distcp").read_bytes() == b"another job's shards"


def test_a_save_or_deletion_killed_midway_leaves_a_folder_fp8lab_may_remove(tmp_path):
    tmp = tmp_path / "step_00000012.tmp"  # kill -9 between the folder's mkdir and the manifest's rename
    tmp.mkdir()
    assert ownership.own_checkpoint(tmp) and ownership.foreign(tmp_path, "checkpoints") == []
    (tmp / (ownership.TMP_PREFIX + "abc")).write_text('{"written_by": "fp8')  # the manifest's half-written temporary
    assert ownership.own_checkpoint(tmp) and fckpt.remove_partial(tmp_path) == [tmp] and not tmp.exists()
    done = tmp_path / "step_00000010"  # a deletion killed between its last file and the folder
    done.mkdir()
    assert ownership.own_checkpoint(done) and fckpt.foreign_steps(tmp_path, 20) == []
    (done / "notes.txt").write_text("the user's")  # anything else in it: not fp8lab's, never removed
    assert not ownership.own_checkpoint(done) and fckpt.foreign_steps(tmp_path, 20) == ["step_00000010"]


@pytest.mark.parametrize("cut", range(5))  # 5 files: a kill before each unlink
def test_a_checkpoint_deleted_up_to_a_kill_is_neither_loaded_nor_refused(tmp_path, monkeypatch, cut):
    ck = tmp_path / "step_00000004"  # an old checkpoint being pruned when the run is killed
    ck.mkdir()
    for name in ("__0_0.distcp", "__1_0.distcp", fckpt.METADATA, fckpt.TRAINER_FILE.format(rank=0)):
        (ck / name).write_bytes(b"x")
    fckpt._write_manifest(ck, 4)
    assert fckpt.complete_checkpoints(tmp_path) == [(4, ck)]
    unlink, done = Path.unlink, []

    def killed_after_cut(self, missing_ok=False):
        if len(done) == cut:
            raise KeyboardInterrupt  # the process dies here: nothing after it runs
        done.append(self.name)
        unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", killed_after_cut)
    with pytest.raises(KeyboardInterrupt):
        fckpt._delete(ck, ignore_errors=True)
    monkeypatch.undo()
    assert ownership.own_checkpoint(ck) and fckpt.foreign_steps(tmp_path, 10) == []
    assert fckpt.complete_checkpoints(tmp_path) == ([(4, ck)] if cut == 0 else [])
    fckpt._delete(ck)
    assert not ck.exists()


def test_a_checkpoint_folder_lock_is_not_a_foreign_file(tmp_path):
    lock = runlock.acquire("--checkpoint-dir", tmp_path)
    try:
        assert ownership.foreign(tmp_path, "checkpoints") == []
        with pytest.raises(ValueError, match="--checkpoint-dir=.* is in use by another fp8lab run"):
            runlock.acquire("--checkpoint-dir", tmp_path)  # a second open of the file: flock refuses it as another run's
    finally:
        lock.release()


# ------------------------------------------------------------------------------------ failures in one line

def test_a_summary_that_cannot_be_written_keeps_the_checkpoint_failure_and_says_what_is_kept(tmp_path):
    os.mkfifo(tmp_path / "summary.json")  # no file fp8lab may replace: its write fails as a full disk's would
    ownership.claim(tmp_path, "run")
    m = StepMetrics(None, None, tmp_path, None)
    first = "fp8lab: stopped at step 2: writing its checkpoint to --checkpoint-dir 'checkpoints' failed (...)."
    msg = m.write_summary({"message": first}, plot=False, checkpoints=[])
    assert msg.startswith(first) and "writing summary.json in" in msg and "no checkpoint is complete" in msg
    assert "checkpoints are kept" not in msg
    msg = m.write_summary({"message": None}, plot=False, checkpoints=[1, 3])
    assert "checkpoint step_00000003 is kept" in msg


def test_failure_reasons_name_no_absolute_path(tmp_path):
    exc = OSError(28, "No space left on device")
    exc.filename = str(tmp_path / "ck" / "step_00000002.tmp" / "__0_0.distcp")
    why = failure_reason(OSError(28, f"No space left on device: '{exc.filename}'"))
    assert str(tmp_path) not in why and "'<abs>/__0_0.distcp'" in why
    assert shareable_text("at /a/b/c.pt. Then") == "at <abs>/c.pt. Then"
    line = ftrain.write_failure(exc, ftrain.TrainConfig(output_dir=str(tmp_path)))
    assert line == "OSError: No space left on device (ck/step_00000002.tmp/__0_0.distcp)", line


# ------------------------------------------------------------------------------------ prepare-data

def test_prepare_data_under_a_file_size_limit_leaves_no_partial_shard(tmp_path):
    src = corpus(tmp_path / "text")
    out = tmp_path / "tokens"
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "prepare-data", str(out), "--source", str(src),
                           "--vocab-size", "512", "--shard-tokens", "100000"], env=ENV, capture_output=True, text=True,
                          timeout=300, preexec_fn=file_limit(4096))
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert err.startswith("fp8lab prepare-data: error: File too large (train_00000.bin)") and "partial shards were removed" in err
    assert sorted(p.name for p in out.iterdir()) == [".fp8lab-lock", ownership.MARKER]
    # the folder is fp8lab's and empty of data: the same command, with room, prepares it
    m = fdata.prepare_data(src, out, None, vocab_size=512, shard_tokens=100000)
    assert m["splits"]["train"]["tokens"] > 0 and fdata.is_prepared(out)


def test_prepare_data_is_refused_while_another_writes_or_a_training_run_reads_the_folder(tmp_path, capsys):
    src = corpus(tmp_path / "text")
    out = tmp_path / "tokens"
    fdata.prepare_data(src, out, None, vocab_size=512)
    data = lambda: {p.name: digest(p) for p in out.iterdir() if p.is_file() and p.name != ".fp8lab-lock"}  # noqa: E731
    before = data()
    for shared, who in ((False, "another fp8lab prepare-data (pid"), (True, "(a training run reads it)")):
        other = holder(out, shared=shared)
        try:
            assert run_data.main([str(out), "--source", str(src), "--vocab-size", "512"]) == 2
            err = capsys.readouterr().err.strip()
            assert err.startswith(f"fp8lab prepare-data: error: OUT_DIR={str(out)!r} is in use by") and who in err, err
        finally:
            other.kill()
            other.wait()
        assert data() == before
    # and a training run's reader lock is refused while prepare-data writes
    writer = runlock.acquire("OUT_DIR", out, user="prepare-data")
    try:
        code = textwrap.dedent(f"""
            from fp8lab.records import runlock
            try:
                runlock.acquire_shared('--data', {str(out)!r})
            except ValueError as exc:
                print(exc)
        """)
        got = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60).stdout
        assert f"--data={str(out)!r} is being written by fp8lab prepare-data (pid {os.getpid()} on " in got, got
    finally:
        writer.release()


def test_a_user_folders_tokenizer_that_maps_ids_otherwise_is_told_apart(tmp_path):
    from fp8lab.model.user import tokenizer_differs

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    data_tok = fdata.shipped_tokenizer_path(512)
    assert not tokenizer_differs(str(folder), data_tok)  # no tokenizer: the data's goes along
    (folder / "tokenizer.json").write_bytes(data_tok.read_bytes())
    assert not tokenizer_differs(str(folder), data_tok)
    (folder / "tokenizer.json").write_bytes(fdata.shipped_tokenizer_path(32000).read_bytes())
    assert tokenizer_differs(str(folder), data_tok)
    assert not tokenizer_differs("llama-tiny", data_tok)


def test_ownership_keeps_a_run_id_and_the_model_folder_names_its_run(tmp_path):
    run = ownership.claim(tmp_path / "run", "run")
    rid = ownership.run_id(run)
    assert rid and ownership.claim(run, "run") and ownership.run_id(run) == rid  # kept across claims
    model = ownership.claim(tmp_path / "model", "model", run=rid)
    assert ownership.run_id(model) == rid
    assert ownership.run_id(ownership.claim(tmp_path / "other", "run")) != rid
