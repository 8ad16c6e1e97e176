"""The notebook runner: parameter injection and validation, failure messages, glue read-back,
and the hygiene rules every committed notebook must follow."""
from __future__ import annotations

import json
import subprocess
import sys

import nbformat
import pytest

from fp8lab import notebooks


def _write_nb(path, param_src, body_src):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    p = nbformat.v4.new_code_cell(param_src)
    p.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# toy"), p, nbformat.v4.new_code_cell(body_src)]
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def toy_dir(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    _write_nb(d / "01_square.ipynb", "x = 3  # any int\nlabel = 'a'",
              "from fp8lab.notebooks import glue\nglue('square', x * x)\nglue('label', label)")
    _write_nb(d / "02_boom.ipynb", "fail = True", "y = 1\nif fail:\n    raise ValueError('planned failure')\nglue_ok = 1")
    return d


def test_run_injects_parameters_and_reads_glued_values(toy_dir, tmp_path):
    res = notebooks.run(["01"], {"x": 7, "label": "seven"}, output_dir=tmp_path / "out", progress=False, directory=toy_dir)
    assert [r.ok for r in res] == [True]
    assert notebooks.read_glued(res[0].output) == {"square": 49, "label": "seven"}
    # defaults too
    res = notebooks.run(["01_square"], None, output_dir=tmp_path / "out2", progress=False, directory=toy_dir)
    assert notebooks.read_glued(res[0].output)["square"] == 9


def test_the_kernel_talks_over_private_local_sockets_without_a_warning(toy_dir, tmp_path, capfd, monkeypatch):
    """Over TCP ipykernel warns on every run that anyone on the machine could eavesdrop; the runner
    uses Unix sockets in a private temporary folder, removed afterwards."""
    import shutil
    import tempfile
    from pathlib import Path

    # a temporary folder of this test's own (short: a socket's path has a length limit), where no other test's
    # notebook run (another pytest-xdist worker's) makes or removes kernel folders while this one counts them
    own = Path(tempfile.mkdtemp(prefix="fp8lab-test-"))
    folders = lambda: set(own.glob("fp8lab-kernel-*"))  # noqa: E731
    try:
        with monkeypatch.context() as m:  # undone before the folder goes: pytest's own temporary files follow it
            m.setattr(tempfile, "tempdir", str(own))
            before = folders()
            res = notebooks.run(["01"], None, output_dir=tmp_path / "out", progress=False, directory=toy_dir)
        assert res[0].ok and notebooks.read_glued(res[0].output)["square"] == 9
        err = capfd.readouterr().err
        assert "without encryption" not in err and "WARNING" not in err, err
        assert folders() == before
    finally:
        shutil.rmtree(own, ignore_errors=True)


def test_unknown_parameter_is_rejected_with_valid_names(toy_dir, tmp_path):
    with pytest.raises(ValueError) as err:
        notebooks.run(["01"], {"y": 1}, output_dir=tmp_path, progress=False, directory=toy_dir)
    msg = str(err.value)
    assert "y" in msg and "label" in msg and "x" in msg
    assert not (tmp_path / "01_square.ipynb").exists()  # rejected before executing anything


def test_failure_names_notebook_cell_and_error(toy_dir, tmp_path):
    with pytest.raises(notebooks.NotebookError) as err:
        notebooks.run(None, None, output_dir=tmp_path, progress=False, directory=toy_dir)
    msg = str(err.value)
    assert "02_boom.ipynb" in msg and "code cell" in msg and "planned failure" in msg and "ValueError" in msg


def test_keep_going_reports_each_notebook(toy_dir, tmp_path):
    res = notebooks.run(None, {"fail": True}, output_dir=tmp_path, progress=False, directory=toy_dir, stop_on_error=False)
    assert [(r.name, r.ok) for r in res] == [("01_square", True), ("02_boom", False)]
    text = notebooks.summary(res)
    assert "1/2 notebooks ok" in text and "FAILED" in text


def test_unknown_notebook_name_lists_choices(toy_dir):
    with pytest.raises(ValueError, match="01_square"):
        notebooks.resolve(["07"], toy_dir)


def test_cli_rejects_unknown_parameter():
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "notebooks", "run", "01", "-p", "no_such_param", "1"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert "no_such_param" in proc.stderr and "valid parameters" in proc.stderr


def test_coerce_parses_literals():
    assert notebooks.coerce("3") == 3 and notebooks.coerce("True") is True
    assert notebooks.coerce("['a', 'b']") == ["a", "b"] and notebooks.coerce("llama-tiny") == "llama-tiny"


# --- rules for the committed notebooks ------------------------------------------------------

COMMITTED = notebooks.list_notebooks()


def test_the_numbered_sequence_exists():
    stems = [p.stem.split("_")[0] for p in COMMITTED]
    assert stems[:1] == ["01"], stems
    assert stems == sorted(stems) and len(set(stems)) == len(stems)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_notebook_is_clean(path):
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path.name} has outputs"
            assert cell.get("execution_count") is None, f"{path.name} has execution counts"
    # exactly one parameters cell, whose defaults parse
    params = notebooks.declared_parameters(path)
    assert params, f"{path.name} declares no parameters"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert not any("def " in "".join(c["source"]).split("\n", 1)[0] for c in code), "logic belongs in fp8lab"


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_every_committed_cell_has_an_id(path):
    """nbformat 4.5's cell ids, unique in the notebook: without one nbformat warns (MissingIDFieldWarning) whenever
    the notebook is read, and will refuse it; the raw JSON is read, as nbformat's reader would add missing ones."""
    nb = json.loads(path.read_text())
    ids = [c.get("id") for c in nb["cells"]]
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), path.name
    assert None not in ids, f"{path.name}: cell {ids.index(None)} has no id (nbformat.validator.normalize adds one)"
    assert len(set(ids)) == len(ids), f"{path.name}: cell ids repeat"
    nbformat.validate(nbformat.reads(path.read_text(), as_version=4))  # and nbformat finds the notebook valid


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_every_notebook_ends_with_what_it_showed_and_two_experiments(path):
    """The last cells a learner reads: a "What this run showed" heading, the cell tagged ``glue`` that shows the run's
    numbers as bullets, then "Try this" with two experiments, each a papermill command of this notebook."""
    cells = nbformat.read(str(path), as_version=4).cells
    heading, summary, experiments = cells[-3:]
    assert heading.cell_type == "markdown" and heading.source.strip() == "## What this run showed", path.name
    assert summary.cell_type == "code" and summary.metadata.get("tags") == ["glue"], path.name
    assert "Markdown(" in summary.source and "glue(" in summary.source, path.name
    assert experiments.cell_type == "markdown" and experiments.source.startswith("## Try this"), path.name
    bullets = [line for line in experiments.source.splitlines() if line.startswith("* ")]
    assert len(bullets) == 2, f"{path.name}: {len(bullets)} experiments"
    assert all(f"`papermill notebooks/{path.name} out.ipynb -" in b for b in bullets), bullets


def test_notebook_02_shows_transformer_engines_own_api():
    """Beside convert_model, one cell in TE's own API: a te.Linear, a DelayedScaling recipe and te.autocast (it runs
    on an FP8 GPU, tests/gpu/test_convert_gpu.py; elsewhere it says what it needs)."""
    nb = nbformat.read(str(notebooks.resolve(["02"])[0]), as_version=4)
    raw = [c.source for c in nb.cells
           if c.cell_type == "code" and "import transformer_engine.pytorch as te" in c.source]
    assert len(raw) == 1
    assert all(s in raw[0] for s in ("te.Linear(", "DelayedScaling(", "with te.autocast(", "needs an FP8 GPU"))


@pytest.mark.parametrize("path", COMMITTED, ids=[p.stem for p in COMMITTED])
def test_committed_notebook_names_the_fp8lab_kernel(path):
    """The kernel scripts/setup.sh registers (JupyterLab and SageMaker Studio open it by this name)."""
    assert json.loads(path.read_text())["metadata"]["kernelspec"]["name"] == notebooks.KERNEL == "fp8lab"


def test_default_kernel_is_fp8lab_only_where_it_runs_this_python(tmp_path, monkeypatch):
    data = tmp_path / "jupyter"
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(data))
    monkeypatch.setenv("JUPYTER_PATH", "")
    # a venv's own kernels (set-up registers fp8lab there too) would otherwise come first (jupyter_core)
    monkeypatch.setenv("JUPYTER_PREFER_ENV_PATH", "0")
    spec = data / "kernels" / "fp8lab"
    spec.mkdir(parents=True)
    kernel = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
              "display_name": "fp8lab (Python 3)", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))
    # sys.executable may be a venv's bin/python: its folder's parent is the prefix
    from pathlib import Path
    expected = "fp8lab" if Path(sys.executable).absolute().parent.parent == Path(sys.prefix).absolute() else "python3"
    assert notebooks.default_kernel() == expected
    kernel["argv"][0] = str(tmp_path / "other-venv" / "bin" / "python")  # another environment's kernel
    (spec / "kernel.json").write_text(json.dumps(kernel))
    assert notebooks.default_kernel() == "python3"


def test_work_folder_moves_a_kernel_started_beside_the_notebook_into_outputs(tmp_path, monkeypatch):
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / "02_x.ipynb").write_text("{}")
    monkeypatch.chdir(tmp_path / "notebooks")
    assert notebooks.work_folder("02_x") == tmp_path / "outputs" / "02_x"
    from pathlib import Path
    assert Path.cwd() == tmp_path / "outputs" / "02_x"
    assert notebooks.work_folder("02_x") == Path.cwd()  # the runner's folder (or any other) stays


def test_list_parameters_take_plain_papermills_string():
    """``papermill -p instance_counts "[1, 2, 4, 8]"`` hands a notebook the string; ``as_list`` reads it as the list and
    names the parameter when it is none; the runner's value check accepts the same string."""
    assert notebooks.as_list("instance_counts", "[1, 2, 4, 8]") == [1, 2, 4, 8]
    assert notebooks.as_list("models", ["llama-1b"]) == ["llama-1b"] and notebooks.as_list("runs", "[]") == []
    for bad in ("[1, 2", "llama-1b", 3):
        with pytest.raises(ValueError, match="is invalid; allowed: a list"):
            notebooks.as_list("instance_counts", bad)
    nb04 = notebooks.resolve(["04"])[0]
    notebooks.check_values(nb04, {"instance_counts": "[1, 2, 4, 8]"})
    with pytest.raises(ValueError, match="instance_counts='8' is invalid; allowed: a list"):
        notebooks.check_values(nb04, {"instance_counts": "8"})


def test_an_old_parameter_name_is_refused_with_the_new_one():
    """One name per quantity across the notebooks: notebook 05 takes notebook 04's ``tokens`` and ``price_per_hour``;
    the old names are refused before anything runs, by the runner and (plain papermill) by the notebook."""
    for names in (["05"], ["04", "05"]):
        with pytest.raises(ValueError, match="token_budget was renamed tokens"):
            notebooks.run(names, {"token_budget": 1e9}, progress=False)
    with pytest.raises(ValueError, match="price_per_instance_hour was renamed price_per_hour"):
        notebooks.check_renamed({"price_per_instance_hour": 1.0, "tokens": 1})
    notebooks.check_renamed({"tokens": 1, "price_per_hour": 2})  # the new names pass
    for path in notebooks.list_notebooks():  # no notebook declares an old name
        assert not set(notebooks.RENAMED) & set(notebooks.declared_parameters(path)), path.name


def _write_stamping_nb(path):
    """A notebook that says it started (``started`` in the runner's working folder for it), with ``together`` waits
    until another notebook of the run has started too (up to a minute: a runner that executes one notebook at a time
    never gets there), sleeps ``then`` seconds and records its process and folder."""
    return _write_nb(path, "together = True\nthen = 0.0\npatience = 60.0",
                     "import json, os, time\nopen('started', 'w').close()\nt0 = time.time()\n"
                     "others = lambda: [f for f in os.listdir('..') if f != os.path.basename(os.getcwd())\n"
                     "                  and os.path.exists(os.path.join('..', f, 'started'))]\n"
                     "while together and not others():\n"
                     "    assert time.time() - t0 < patience, 'no other notebook started beside this one'\n"
                     "    time.sleep(0.1)\n"
                     "time.sleep(then)\njson.dump({'pid': os.getpid(), 'cwd': os.getcwd()}, open('stamp.json', 'w'))")


def test_two_jobs_run_two_kernels_at_once_each_in_its_own_folder(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    for name in ("01_a", "02_b", "03_c"):
        _write_stamping_nb(d / f"{name}.ipynb")
    out = tmp_path / "out"
    # 01 waits for another notebook to start: it finishes only if 02's kernel runs beside it
    res = notebooks.run(None, None, output_dir=out, progress=False, directory=d, jobs=2)
    assert [(r.name, r.ok) for r in res] == [("01_a", True), ("02_b", True), ("03_c", True)]
    stamps = {n: json.loads((out / n / "stamp.json").read_text()) for n in ("01_a", "02_b", "03_c")}
    assert {n: s["cwd"] for n, s in stamps.items()} == {n: str((out / n).resolve()) for n in stamps}
    assert len({s["pid"] for s in stamps.values()}) == 3
    one = notebooks.run(["01"], {"patience": 3.0}, output_dir=tmp_path / "alone", progress=False, directory=d,
                        jobs=2, stop_on_error=False)
    assert not one[0].ok and "no other notebook started" in one[0].error  # the wait is real


def test_two_jobs_stop_after_a_failure_and_name_it(tmp_path):
    d = tmp_path / "nbs"
    d.mkdir()
    _write_stamping_nb(d / "01_slow.ipynb")
    _write_nb(d / "02_boom.ipynb", "fail = True", "open('started', 'w').close()\nif fail:\n"
              "    raise ValueError('planned failure')")
    _write_nb(d / "03_after.ipynb", "z = 1", "raise RuntimeError('must not run')")
    out = tmp_path / "out"
    with pytest.raises(notebooks.NotebookError) as err:
        notebooks.run(None, {"then": 3.0}, output_dir=out, progress=False, directory=d, jobs=2)
    msg = str(err.value)
    assert "02_boom.ipynb" in msg and "planned failure" in msg
    # 01 and 02 started together; 02 failed while 01 still ran, so 03 never started, and 01 was let finish
    assert (out / "01_slow" / "stamp.json").exists() and not (out / "03_after.ipynb").exists()
    res = notebooks.run(None, None, output_dir=tmp_path / "k", progress=False, directory=d, jobs=2,
                        stop_on_error=False)
    assert [(r.name, r.ok) for r in res] == [("01_slow", True), ("02_boom", False), ("03_after", False)]
    assert "must not run" in res[2].error


@pytest.mark.parametrize("value", [0, -2, True, 1.5, "2"])
def test_a_bad_jobs_value_is_refused_before_anything_runs(toy_dir, tmp_path, value):
    with pytest.raises(ValueError, match=r"jobs=.* is invalid; allowed: a positive integer"):
        notebooks.run(None, None, output_dir=tmp_path / "out", progress=False, directory=toy_dir, jobs=value)
    assert not (tmp_path / "out").exists()


def test_the_cli_refuses_a_bad_jobs_value_in_one_line(capsys):
    with pytest.raises(SystemExit):
        notebooks.main(["run", "--jobs", "0"])
    err = capsys.readouterr().err.strip()
    assert "-j/--jobs" in err and "positive integer, or auto" in err and len(err.splitlines()) == 1


def test_default_jobs_one_per_core_without_a_gpu_and_one_with_it():
    assert notebooks.default_jobs(2, False, 6) == 2
    assert notebooks.default_jobs(16, False, 6) == 6
    assert notebooks.default_jobs(1, False, 6) == 1
    assert notebooks.default_jobs(None, False, 6) == 1
    assert notebooks.default_jobs(16, True, 6) == 1
