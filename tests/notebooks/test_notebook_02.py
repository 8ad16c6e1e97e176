"""Notebook 02 executed for real with papermill: defaults (Llama, fused) and GPT-Neo swapped with
current scaling; values read back from the executed notebook."""
from __future__ import annotations

import nbformat
import pytest

from figure_outputs import assert_figures_readable_and_saved
from fp8lab.notebooks import NotebookError, read_glued, run
from prose import assert_notebook_prose_short


def _run(tmp_path, params):
    res = run(["02"], params, output_dir=tmp_path, progress=False)
    return read_glued(res[0].output), res[0].output


def _has_png(path) -> bool:
    nb = nbformat.read(str(path), as_version=4)
    return any("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def test_notebook_02_defaults(tmp_path):
    vals, out = _run(tmp_path, {})
    assert_notebook_prose_short(out)
    assert vals["model"] == "llama-tiny" and vals["fuse"] is True and vals["recipe"] == "delayed"
    if vals["backend"] == "emulated":  # CPU, float32: the emulated model is the HF computation
        assert vals["fp8_off_logits_rel_diff"] < 1e-5 and vals["fp8_off_loss_abs_diff"] < 1e-5
        assert vals["timings"] is None
    assert vals["round_trip_identical"] is True
    # three-way against an fp32 forward of the same weights: on a CPU in float32 all three agree
    if vals["backend"] == "emulated":
        assert vals["fp32_hf_logits_rel_diff"] < 1e-6 and vals["fp32_converted_logits_rel_diff"] < 1e-5
    assert vals["fp32_converted_at_least_as_close"] is True
    assert len(vals["fp32_per_layer"]) == vals["num_layers"]
    assert vals["high_precision"] == ["embed", "norm", "lm_head"]
    assert vals["fp8_modules"] == 3 * vals["num_layers"]
    errs = vals["fp8_error_per_layer"]
    assert len(errs) == vals["num_layers"] and all(0 < e < 0.2 for e in errs)
    assert 1e-3 < vals["fp8_on_logits_rel_diff"] < 0.2
    assert _has_png(out) and (tmp_path / "02_convert_to_te" / "fp8_error_per_layer.png").exists()
    assert "fp8_error_per_layer.png" in assert_figures_readable_and_saved(out, tmp_path / "02_convert_to_te")


def test_notebook_02_gptneo_swapped_current_scaling(tmp_path):
    vals, _ = _run(tmp_path, {"family": "gptneo", "fuse": False, "recipe": "current", "backend": "emulated",
                              "num_layers": 3, "seq_len": 48})
    assert (vals["model"], vals["backend"], vals["fuse"], vals["recipe"]) == ("gptneo-tiny", "emulated", False, "current")
    assert vals["num_layers"] == 3 and len(vals["fp8_error_per_layer"]) == 3
    assert vals["fp8_modules"] == 6 * 3  # q, k, v, out, c_fc, c_proj per block; lm_head excluded
    assert "lm_head" in vals["high_precision"] and "transformer.wte" in vals["high_precision"]
    assert vals["fp8_off_logits_rel_diff"] < 1e-5 and vals["round_trip_identical"] is True
    assert vals["fp8_on_logits_rel_diff"] > 1e-3


def test_notebook_02_rejects_a_bad_size(tmp_path):
    with pytest.raises(NotebookError, match="unknown model 'llama-2b'"):
        run(["02"], {"size": "2b"}, output_dir=tmp_path, progress=False)


def test_opened_from_the_notebooks_folder_it_writes_into_outputs(tmp_path):
    """As JupyterLab runs it (kernel started in notebooks/): the figure lands in outputs/02_convert_to_te/,
    where `fp8lab notebooks run` puts it, and nothing new appears beside the notebooks."""
    from lab_run import run_from_notebooks_folder

    vals = run_from_notebooks_folder(tmp_path, "02_convert_to_te", {"seq_len": 32})
    assert vals["model"] == "llama-tiny"
    assert (tmp_path / "outputs" / "02_convert_to_te" / "fp8_error_per_layer.png").is_file()
    assert sorted(p.name for p in (tmp_path / "notebooks").iterdir()) == ["02_convert_to_te.ipynb"]
