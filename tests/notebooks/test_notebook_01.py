"""Notebook 01 executed for real (papermill), with its defaults and with E5M2 + margin 1.

Both runs share one module-scoped fixture each, so every assertion reads the same executed copy.
"""
from __future__ import annotations

import math

import nbformat
import pytest
import torch

from fp8lab.views import formats as V
from figure_outputs import assert_figures_readable_and_saved
from fp8lab.notebooks import NOTEBOOK_DIR, read_glued, run
from prose import assert_notebook_prose_short

# same model, tokens and seed; only the format and the margin change
OTHER = {"fmt": "E5M2", "margin": 1}


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    res = run(["01"], {}, output_dir=tmp_path_factory.mktemp("nb01_default"), progress=False)
    return res[0].output, read_glued(res[0].output)


@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    res = run(["01"], OTHER, output_dir=tmp_path_factory.mktemp("nb01_e5m2"), progress=False)
    return res[0].output, read_glued(res[0].output)


def _png_count(path) -> int:
    nb = nbformat.read(str(path), as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))


def test_default_run_values(default_run):
    path, g = default_run
    assert_notebook_prose_short(path)  # every paragraph, the run's own summary included, at most 600 characters
    assert len(assert_figures_readable_and_saved(path, path.with_suffix(""))) == _png_count(path)
    assert g["e4m3_max"] == 448.0 and g["e5m2_max"] == 57344.0
    assert g["n_values_e4m3"] == 253 and g["n_values_e5m2"] == 247
    # real gradients of a random-init Llama, cast to E5M2 as TE casts gradients: a share vanishes without a
    # scale, next to none with current scaling; E4M3, for contrast, loses most of them
    assert g["grad_underflow_unscaled"] > 0.1 and g["grad_underflow_current"] < 0.001
    assert g["grad_underflow_unscaled_e4m3"] > 0.5 > g["grad_underflow_unscaled"]
    assert g["grad_snr_current_db"] > 20
    # outlier tensor: block/MX scaling protect the bulk that per-tensor scaling pushes into subnormals
    bulk, under = g["recipe_bulk_mean_rel_error"], g["recipe_underflow"]
    assert bulk["block 1x128"] < bulk["current per-tensor"] and bulk["MXFP8 (1x32, E8M0)"] < bulk["current per-tensor"]
    assert under["MXFP8 (1x32, E8M0)"] < under["block 1x128"] < under["current per-tensor"]
    # the stale delayed history clips the grown outliers; current scaling never clips
    clipped = g["recipe_clipped"]
    assert clipped["delayed (stale history)"] > 0 and clipped["current per-tensor"] == 0
    # the default outliers exceed E4M3's 448: without a scale they clip, and that costs the most SNR
    assert clipped["no scaling"] > 0
    assert g["recipe_snr_db"]["no scaling"] < g["recipe_snr_db"]["delayed (stale history)"] < g["recipe_snr_db"]["current per-tensor"]
    assert g["recipe_snr_db"]["delayed (stale history)"] < g["recipe_snr_db"]["current per-tensor"] - 10
    # the spike step is clipped by both delayed algorithms, never by current scaling
    assert g["spike_clipped"]["max"] > 0.5 and g["spike_clipped"]["most_recent"] > 0.5
    assert g["spike_clipped"]["current"] == 0
    ex = g["explorer"]
    assert (ex["fmt"], ex["margin"], ex["history_len"]) == ("E4M3", 0, 16)
    assert ex["scale_after_spike"] < ex["scale_before_spike"] / 1000  # the spike's amax now rules the scale
    assert ex["snr_after_spike_db"] < ex["snr_before_spike_db"] - 2
    assert ex["steps_to_recover"] == 16 + 1  # the spike leaves a 16-step history one step after it
    assert _png_count(path) >= 7  # bits, value grid, rel. error, histograms, recipes, spike, explorer


def test_other_run_differs_as_expected(default_run, other_run):
    path, o = other_run
    _, d = default_run
    assert o["explorer"]["fmt"] == "E5M2" and o["explorer"]["margin"] == 1
    # gradients are cast to E5M2 whatever fmt says (TE's HYBRID format): unscaled, the same in both runs
    assert o["grad_underflow_unscaled"] == d["grad_underflow_unscaled"]
    assert o["grad_underflow_unscaled_e4m3"] == d["grad_underflow_unscaled_e4m3"]
    # same tensors, other format and margin: scales differ by exactly 57344 / 448 / 2**1 = 64
    ratio = o["explorer"]["scale_before_spike"] / d["explorer"]["scale_before_spike"]
    assert ratio == pytest.approx(64, rel=1e-6)
    # E5M2's range absorbs the post-spike scale that costs E4M3 its small values
    assert o["explorer"]["underflow_after_spike"] < d["explorer"]["underflow_after_spike"]
    assert o["explorer"]["steps_to_recover"] < d["explorer"]["steps_to_recover"]
    assert o["spike_clipped"]["max"] > 0.5
    # the format-independent numbers are the same in both runs
    assert (o["e4m3_max"], o["n_values_e5m2"]) == (d["e4m3_max"], d["n_values_e5m2"])
    assert _png_count(path) >= 7  # bits, value grid, rel. error, histograms, recipes, spike, explorer


def test_explorer_scale_follows_format_and_margin():
    """Same tensor, E5M2 with margin 1 vs E4M3 with margin 0: scales differ by 57344 / 448 / 2 = 64."""
    g = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 1e-4
    _, a = V.explorer_figure(g, "E4M3", 0, 8, spike_factor=1e4, steps=24, spike_step=8)
    _, b = V.explorer_figure(g, "E5M2", 1, 8, spike_factor=1e4, steps=24, spike_step=8)
    assert b["scale_before_spike"] / a["scale_before_spike"] == pytest.approx(64, rel=1e-6)
    assert a["steps_to_recover"] == 9 and b["steps_to_recover"] == 1  # E5M2 barely notices the small scale


def test_explorer_widget_shows_the_numbers_of_each_setting():
    """The widget's wiring without a browser; tests/notebooks/test_browser.py moves it in JupyterLab."""
    import html

    import matplotlib.pyplot as plt

    g = torch.randn(64, 128, generator=torch.Generator().manual_seed(0)) * 1e-4
    box = V.explorer_widget(g, "E4M3", 0, 8)
    controls, stats_line, out = box.children
    fmt, margin, history = controls.children
    assert box._dom_classes == ("fp8lab-explorer",) and out._dom_classes == ("fp8lab-explorer-figure",)
    assert [c._dom_classes for c in (fmt, margin, history, stats_line)] == [
        ("fp8lab-explorer-fmt",), ("fp8lab-explorer-margin",), ("fp8lab-explorer-history",), ("fp8lab-explorer-stats",)]
    assert stats_line.value.startswith("Move a control")  # nothing is computed before a control moves
    for setting, (f, m) in (("margin", ("E4M3", 1)), ("fmt", ("E5M2", 1))):
        (margin if setting == "margin" else fmt).value = m if setting == "margin" else f
        _, expected = V.explorer_figure(g, f, m, 8)
        assert stats_line.value == html.escape(V.explorer_summary(expected))
        assert stats_line.value.startswith(f"{f}, margin {m}, history 8: scale ")
    plt.close("all")
    assert V.explorer_summary({**expected, "steps_to_recover": None}).endswith("SNR not back within 1 dB")
    assert V.explorer_summary({**expected, "steps_to_recover": 1}).endswith("SNR back within 1 dB in 1 step")


def test_capture_tensors_on_a_real_llama():
    model = V.tiny_llama(64, 1, 32, seed=0)
    ids = torch.randint(0, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    cap = V.capture_tensors(model, ids)
    names = set(cap.weights)
    assert len(names) == 7  # q, k, v, o, gate, up, down of the one layer (lm_head excluded)
    assert names == set(cap.activations) == set(cap.gradients)
    for n in names:
        w, a, gr = cap.weights[n], cap.activations[n], cap.gradients[n]
        assert a.shape[-1] == w.shape[1] and gr.shape[-1] == w.shape[0]
        assert torch.isfinite(gr).all() and gr.abs().sum() > 0
    assert math.isfinite(cap.loss) and not any(h for h in model._forward_hooks.values())
    with pytest.raises(ValueError, match="model_hidden must be a multiple of 64"):
        V.tiny_llama(100)
    with pytest.raises(ValueError, match="kind must be one of"):
        cap.flat("biases")


@pytest.mark.parametrize("call, match", [
    (lambda x: V.add_outlier_channels(x, n_channels=999), "n_channels must be an int in 0..32"),
    (lambda x: V.simulate_spike(x, steps=10, spike_step=10), "spike_step must be an int in 0..9"),
    (lambda x: V.simulate_spike(x, spike_factor=0), "spike_factor must be a finite number > 0"),
    (lambda x: V.simulate_spike(x, history_len=0), "amax_history_len"),
    (lambda x: V.scaling_comparison(x, "E3M3"), "fmt must be"),
    (lambda x: V.scaling_comparison(x, stale_factor=0), "stale_factor"),
])
def test_viz_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call(torch.randn(4, 32))


def test_bad_parameter_is_rejected_before_running(tmp_path):
    with pytest.raises(ValueError, match="valid parameters are"):
        run(["01"], {"format": "E4M3"}, output_dir=tmp_path, progress=False)


def test_committed_notebook_is_thin_and_clean():
    nb = nbformat.read(str(NOTEBOOK_DIR / "01_fp8_formats.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert sum("parameters" in c.metadata.get("tags", []) for c in code) == 1
    assert not any("def " in c.source for c in code)
