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
