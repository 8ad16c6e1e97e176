"""The figure check (issue 49): every figure the report and the notebooks draw, drawn here from the committed
results and the notebooks' own calls, breaks none of fp8lab.views.figure_checks' rules; and each rule catches the
figure it is written against. (The executed notebooks' figures are checked again in tests/notebooks/, from the
metadata fp8lab.views.plots.show records.)"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from fp8lab import analysis, launch, trainpair
from fp8lab.analysis import scaling
from fp8lab.views import plots, report
from fp8lab.fp8 import formats as F
from fp8lab.views import formats as V
from fp8lab.views.figure_checks import MAX_SIDE_PX, figure_problems


@pytest.fixture(scope="module")
def committed():
    runs = analysis.load_runs()
    config = report.ReportConfig()
    return runs, config, report.Analysed.of(runs, config)


def test_every_report_figure_is_readable(committed):
    runs, config, a = committed
    figs = report.report_figures(runs, config, a)
    assert len(figs) == 8
    figs.append((plots.headline_figure(analysis.best_runs(a.summary), a.reference), "docs/headline.png"))
    problems = {alt: figure_problems(fig) for fig, alt in figs}
    assert all(p == [] for p in problems.values()), {k: v for k, v in problems.items() if v}


def test_headline_figure_counts_the_models_of_the_headline_table(committed):
    """docs/headline.png sits beside the README's headline table: its panels are models of that table and its title
    counts the table's rows (a model with FP8 runs and no BF16 run heads neither)."""
    _, _, a = committed
    fig = plots.headline_figure(analysis.best_runs(a.summary), a.reference)
    table = list(a.headline["model"])
    panels = [ax.get_title().split(" (")[0] for ax in fig.axes if ax.get_visible() and ax.get_title()]
    assert panels and set(panels) <= set(table)
    assert f" of {len(table)} models" in fig._suptitle.get_text()
    assert "llama-1b" in panels and "llama-7b" in panels  # the models the source reported, with plain-HF baselines


def test_every_detail_figure_of_notebook_05_is_readable(committed):
    runs, config, a = committed
    figs = {"throughput": plots.throughput_figure(a.summary), "speedup": plots.speedup_figure(a.comparison, a.reference),
            "mfu": plots.mfu_figure(a.summary), "scaling": plots.scaling_figure(analysis.scaling_table(a.summary)),
            "profile": plots.profile_figure(analysis.load_profiles())}
    problems = {k: figure_problems(f) for k, f in figs.items()}
    assert all(p == [] for p in problems.values()), {k: v for k, v in problems.items() if v}


def test_notebook_01_figures_are_readable():
    model = V.tiny_llama(64, 2, 32, 0)
    batch = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0))
    cap = V.capture_tensors(model, batch)
    act = cap.activations["model.layers.0.mlp.down_proj"]
    x_out, channels = V.add_outlier_channels(act, n_channels=4, factor=1000.0, seed=0)
    grad = cap.gradients["model.layers.1.mlp.down_proj"]
    figs = {"bits": V.plot_bit_layouts(example=0.3), "grid": V.plot_value_grid((F.E4M3, F.E5M2)),
            "relative error": V.plot_relative_error(), "histograms": V.plot_tensor_histograms(cap, F.E4M3),
            "recipes": V.plot_scaling_comparison(V.scaling_comparison(x_out, F.E4M3, outlier_channels=channels)),
            "spike": V.plot_spike(V.simulate_spike(grad, F.E4M3, spike_step=16, spike_factor=100.0), 16),
            "explorer": V.explorer_figure(grad, F.E4M3, 0, 16, 100.0)[0]}
    problems = {k: figure_problems(f) for k, f in figs.items()}
    assert all(p == [] for p in problems.values()), {k: v for k, v in problems.items() if v}
    # the relative error: one line per format, each at its own level inside the range (not a sawtooth heap)
    ax = figs["relative error"].axes[0]
    mid = [float(np.nanmedian(line.get_ydata())) for line in ax.get_lines()]
    assert len(set(np.round(np.log2(mid)))) == 4, mid


def test_notebook_04_figures_are_readable_and_say_projected():
    models, tokens = ["llama-1b", "llama-7b"], 24 * 10**9
    plan = launch.plan_sweep(models, ["bf16", "fp8"], [1, 2, 4], tokens=tokens, role=launch.PLACEHOLDER_ROLE,
                             bucket=launch.PLACEHOLDER_BUCKET)
    curve = launch.plan_curve(models, ["bf16", "fp8"], list(range(1, 9)), tokens, estimate=plan.estimate)
    at = pd.concat([scaling.instance_table(plan.estimate, m, [1, 2, 4, 8, 16], tokens, price_per_hour=plan.price_per_hour)
                    for m in models])
    plan_fig, past = plots.plan_figure(curve), plots.instances_figure(at, analysis.load_reference())
    assert figure_problems(plan_fig) == [] and figure_problems(past) == []
    labels = [t.get_text() for t in past.legends[0].get_texts()]
    assert "measured" not in " ".join(labels) and "projected" in past.get_suptitle()
    assert "projected" in plan_fig.get_suptitle() and not any("measured" in t.get_text() for t in plan_fig.legends[0].get_texts())


def test_notebook_03_pair_figure_shows_the_gap(tmp_path):
    pair = trainpair.run_pair("llama-tiny", 6, ["emulated"], output_dir=tmp_path, seq_len=32, micro_batch_size=2,
                              model_overrides={"num_layers": 1})
    fig = trainpair.pair_figure(pair)
    assert figure_problems(fig) == []
    gap_ax = fig.axes[1]
    (gap,) = [line for line in gap_ax.get_lines() if not line.get_label().startswith("_")]
    assert gap.get_label() == "fp8 emulated vs fp32" and len(gap.get_ydata()) == 6
    # emulated FP8 on a CPU: no tokens/s bar and no speed-up ratio, the final validation loss instead
    right = fig.axes[2]
    assert "validation loss" in right.get_ylabel() and "no speed" in right.get_title()
    assert not any(t.get_text().endswith("x") for t in right.texts)


def test_notebook_02_error_figure_names_the_zero_series_instead_of_a_floor():
    from types import SimpleNamespace as NS

    from fp8lab.views.convert_plots import error_per_layer_figure

    on = NS(per_layer=[NS(rel_diff=v) for v in (0.11, 0.14, 0.16)])
    off = NS(per_layer=[NS(rel_diff=0.0)] * 3,
             fp32=NS(per_layer=[NS(reference_rel_diff=1e-7 * k, converted_rel_diff=1e-7 * k) for k in (1, 2, 3)]))
    fig = error_per_layer_figure(on, off, "llama-tiny", "delayed")
    assert figure_problems(fig) == []
    ax = fig.axes[0]
    assert [line.get_label() for line in ax.get_lines()] == ["FP8 on (delayed), vs HF", "HF vs fp32 = FP8 off, vs fp32"]
    assert "exactly 0 in every block, not drawn: FP8 off, vs HF" in ax.get_title()


# each rule catches what it is written against ---------------------------------------------------------------------
def _fig(w=6.0, h=4.0):
    fig = Figure(figsize=(w, h), layout="constrained")
    return fig, fig.subplots()


def test_rule_overlapping_labels():
    fig, ax = _fig()
    ax.set_xticks([0, 0.01], ["a long model name", "another long model name"])
    ax.set_xlim(-1, 1)
    assert any(p.startswith("labels overlap: 'a long model name'") for p in figure_problems(fig))
    ax.set_xticks([-0.8, 0.8], ["a long model name", "another long model name"])
    assert figure_problems(fig) == []


def test_rule_legend_entries_and_bars():
    fig, ax = _fig(10, 5)
    for i in range(9):
        ax.plot([0, 1], [i, i + 1], color=f"C{i}", label=f"s{i}")
    ax.legend(fontsize=6)
    assert "9 legend entries (at most 8)" in figure_problems(fig)
    fig, ax = _fig(10, 5)
    ax.bar(np.arange(13) * 2.0, np.ones(13))
    ax.set_xticks([])
    assert figure_problems(fig) == ["13 bars in one panel (at most 12)"]
    fig, ax = _fig()
    ax.hist(np.random.default_rng(0).normal(size=500), bins=40)  # a histogram's bins are one shape, not 40 bars
    assert figure_problems(fig) == []


def test_rule_series_drawn_alike_or_hidden():
    fig, ax = _fig()
    ax.plot([0, 1, 2], [1, 2, 3], color="C0", label="a")
    ax.plot([0, 1, 2], [3, 2, 1], color="C0", label="b")
    ax.legend()
    assert figure_problems(fig) == ["'a' and 'b' are drawn alike (colour, line style, marker)"]
    fig, ax = _fig()
    ax.plot([0, 1, 2], [1, 2, 3], color="C0", label="a")
    ax.plot([0, 1, 2], [1, 2, 3], color="C1", label="b")
    ax.legend()
    assert figure_problems(fig) == ["'a' and 'b' have the same data and line style: one hides the other"]
    ax.lines[1].set_linestyle("--")
    assert figure_problems(fig) == []


def test_rule_pixel_size_and_aspect():
    fig, _ = _fig(20, 4)
    assert any("aspect over 3:1" in p for p in figure_problems(fig))
    fig, _ = _fig(10, 20)
    assert any(f"more than {MAX_SIDE_PX} px a side" in p for p in figure_problems(fig))
