"""fp8lab.views.plots: every figure renders, and its axes carry the data of the tables it was given."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure

from fp8lab import analysis
from fp8lab.views import plots
from fp8lab.core.paths import RESULTS_DIR
from fake_runs import make_pair, make_trainer_run, run_meta, step_records


@pytest.fixture
def tables(tmp_path):
    make_pair(tmp_path, 1000.0, 1250.0, val_every=10)
    runs = analysis.load_runs(tmp_path)
    summary = analysis.summarize_runs(runs, warmup_steps=10)
    return runs, summary, analysis.compare_precisions(summary)


def _bars(ax):
    return [p for p in ax.patches if p.get_height() > 0 and p.get_width() > 0]


def _texts(fig: Figure) -> str:
    return " ".join(t.get_text() for ax in fig.axes for t in ax.texts)


def test_throughput_bars_are_the_medians_side_by_side(tables):
    _, summary, _ = tables
    fig = plots.throughput_figure(summary)
    ax = fig.axes[0]
    heights = sorted(p.get_height() for p in _bars(ax))
    assert heights == pytest.approx([1000.0, 1250.0])
    assert ax.get_title() == "llama-1b" and ax.get_ylabel() == "tokens/s/GPU" and ax.get_xlabel() == "GPUs"
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["bf16 te", "fp8 te delayed"]


def test_throughput_groups_by_instance_count_with_quartile_whiskers():
    rows = []
    for n, bf, f8 in ((1, 1000.0, 1300.0), (2, 950.0, 1240.0)):
        for prec, tps in (("bf16", bf), ("fp8", f8)):
            rows += [{**r, "job_name": f"{prec}-{n}", "instance_count": n, "world_size": 8 * n}
                     for r in step_records(12, tps, prec)]
    summary = analysis.summarize_runs(analysis.load_runs(pd.DataFrame(rows)), warmup_steps=2)
    ax = plots.throughput_figure(summary).axes[0]
    assert ax.get_xlabel() == "instances"
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    bars = sorted(_bars(ax), key=lambda p: p.get_x())
    assert [b.get_height() for b in bars] == pytest.approx([1000.0, 1300.0, 950.0, 1240.0])


def test_speedup_bars_and_labelled_reference_markers(tables):
    _, _, comparison = tables
    ref = analysis.load_reference()
    fig = plots.speedup_figure(comparison, ref)
    ax = fig.axes[0]
    assert [p.get_height() for p in _bars(ax)] == pytest.approx([1.25])
    markers = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(markers) == 1
    assert markers[0].get_offsets()[:, 1].tolist() == pytest.approx([1.13, 1.18])
    assert markers[0].get_label() == plots.REFERENCE_LABEL and "not measured here" in plots.REFERENCE_LABEL
    # the 1B reference sits on the measured llama-1b bar; 7B gets its own "(source)" slot
    assert [t.get_text() for t in ax.get_xticklabels()] == ["llama-1b", "7B (source)"]
    assert markers[0].get_offsets()[:, 0].tolist() == [0, 1]


def test_speedup_with_no_measured_runs_still_shows_the_reference():
    empty = analysis.compare_precisions(analysis.summarize_runs(analysis.load_runs([])))
    fig = plots.speedup_figure(empty, analysis.load_reference())
    ax = fig.axes[0]
    assert not _bars(ax)
    assert [c for c in ax.collections if isinstance(c, PathCollection)][0].get_offsets()[:, 1].tolist() == pytest.approx([1.13, 1.18])
    assert plots.NO_DATA in _texts(fig)


def test_loss_curves_are_smoothed_and_gap_is_exact(tables):
    runs, _, _ = tables
    fig = plots.loss_figure(runs, smoothing="ema", smoothing_span=5)
    top, bottom = fig.axes[0], fig.axes[1]
    smoothed = {l.get_gid(): l for l in top.lines if l.get_gid()}
    bf = runs[runs["run_id"] == "bf16"].sort_values("step")
    assert smoothed["smoothed:bf16"].get_xdata().tolist() == bf["tokens"].tolist()
    assert smoothed["smoothed:bf16"].get_ydata() == pytest.approx(analysis.smooth(bf["loss"], "ema", 5).to_numpy())
    raw = [l for l in top.lines if not l.get_gid()]
    assert any(np.allclose(l.get_ydata(), bf["loss"]) for l in raw)
    gap = [l for l in bottom.lines if l.get_gid() == "gap:fp8"][0]
    assert gap.get_ydata() == pytest.approx(np.full(30, 3.0))  # FP8 loss is exactly 1.03x BF16's


def test_loss_without_a_bf16_run_says_what_is_missing(tmp_path):
    make_trainer_run(tmp_path, "only-fp8", "fp8", 1000.0, n=5)
    fig = plots.loss_figure(analysis.load_runs(tmp_path))
    assert "needs a BF16 and an FP8 run" in _texts(fig)


def test_loss_leaves_out_throughput_runs_and_compares_within_a_study(tmp_path):
    for study, tps in (("loss-a", 1.0), ("loss-b", 2.0)):
        for prec, scale in (("bf16", 1.0), ("fp8", 1.01 if study == "loss-a" else 1.02)):
            analysis.write_result_file(tmp_path / f"{prec}-{study}.jsonl",
                                       run_meta("llama-1b", prec, run_id=f"{prec}-{study}", study=study, variant=prec),
                                       step_records(20, 1000.0 * tps, prec, loss_scale=scale * tps))
    analysis.write_result_file(tmp_path / "bench.jsonl", run_meta("llama-1b", "fp8", run_id="bench", study="throughput",
                                                                  variant="fp8", loss_comparable=False),
                               step_records(20, 1000.0, "fp8", loss_scale=5.0))
    fig = plots.loss_figure(analysis.load_runs(tmp_path), smoothing="none")
    top, bottom = fig.axes[0], fig.axes[1]
    assert "smoothed:bench" not in {l.get_gid() for l in top.lines}
    gaps = {l.get_gid(): l for l in bottom.lines if l.get_gid()}
    assert gaps["gap:fp8-loss-a"].get_ydata() == pytest.approx(np.full(20, 1.0))  # against loss-a's BF16 run
    assert gaps["gap:fp8-loss-b"].get_ydata() == pytest.approx(np.full(20, 2.0))  # against loss-b's, not loss-a's
    assert {t.get_text() for t in top.get_legend().get_texts()} == {"bf16 te (loss-a)", "fp8 te delayed fused (loss-a)",
                                                                 "bf16 te (loss-b)", "fp8 te delayed fused (loss-b)"}


def test_loss_figure_names_each_kind_of_run_once_and_gaps_each_fp8_seed_against_its_bf16_twin(tmp_path):
    """A loss study with seeds (issue 31's): the legend lists kinds of run with their seed count, not one entry per
    seed (the parity figure tells seeds apart), and each FP8 run's gap is to the BF16 run of its own seed (the same
    initial weights and data order), not to the first BF16 run."""
    for seed, bf_scale, fp_scale in ((1, 1.0, 1.01), (2, 1.1, 1.1 * 1.03), (3, 0.9, 0.9 * 0.98)):
        for prec, scale in (("bf16", bf_scale), ("fp8", fp_scale)):
            analysis.write_result_file(tmp_path / f"{prec}-s{seed}.jsonl",
                                       run_meta("llama-1b", prec, run_id=f"{prec}-s{seed}", study="parity", variant=prec,
                                                seed=seed), step_records(20, 1000.0, prec, loss_scale=scale))
    fig = plots.loss_figure(analysis.load_runs(tmp_path), smoothing="none")
    top, bottom = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in top.get_legend().get_texts()] == ["bf16 te (3 seeds)", "fp8 te delayed fused (3 seeds)"]
    assert len({l.get_color() for l in top.lines if l.get_gid()}) == 2  # one colour per kind of run
    gaps = {l.get_gid(): l.get_ydata() for l in bottom.lines if l.get_gid()}
    assert gaps["gap:fp8-s1"] == pytest.approx(np.full(20, 1.0))
    assert gaps["gap:fp8-s2"] == pytest.approx(np.full(20, 3.0))  # against bf16-s2, not bf16-s1 (+12.3%)
    assert gaps["gap:fp8-s3"] == pytest.approx(np.full(20, -2.0))


def test_mfu_bars_are_percent(tables):
    _, summary, _ = tables
    ax = plots.mfu_figure(summary).axes[0]
    widths = sorted(p.get_width() for p in _bars(ax))
    assert widths == pytest.approx(sorted(100 * summary["mfu"]))
    assert ax.get_xlabel() == "MFU (% of dense BF16 peak)"


def test_cost_bars_are_hours_and_dollars(tables):
    _, summary, _ = tables
    costs = analysis.cost_table(summary, tokens=1000.0 * 8 * 3600, price_per_instance_hour=50.0)
    fig = plots.cost_figure(costs)
    hours_ax, cost_ax = fig.axes[0], fig.axes[1]
    start = 600 / 3600  # the plan's start-up (analysis.cost_table prices as the plan does)
    assert sorted(p.get_width() for p in _bars(hours_ax)) == pytest.approx([0.8 + start, 1.0 + start])
    assert sorted(p.get_width() for p in _bars(cost_ax)) == pytest.approx([50 * (0.8 + start), 50 * (1 + start)])
    assert "$50.00/instance-hour" in fig.get_suptitle()
    assert "(projected)" in hours_ax.get_yticklabels()[0].get_text()


def test_scaling_lines_are_efficiencies():
    rows = [{**r, "job_name": f"fp8-{n}x", "instance_count": n, "world_size": 8 * n}
            for n, tps in ((1, 1000.0), (2, 970.0), (4, 930.0)) for r in step_records(12, tps, "fp8")]
    scaling = analysis.scaling_table(analysis.summarize_runs(analysis.load_runs(pd.DataFrame(rows)), warmup_steps=2))
    ax = plots.scaling_figure(scaling).axes[0]
    line = [l for l in ax.lines if l.get_label().startswith("llama-1b")][0]
    assert line.get_xdata().tolist() == [1, 2, 4]
    assert line.get_ydata() == pytest.approx([1.0, 0.97, 0.93])


def test_every_figure_renders_on_empty_tables_and_saves_png_and_svg(tmp_path):
    runs = analysis.load_runs([])
    summary = analysis.summarize_runs(runs)
    figs = {
        "throughput": plots.throughput_figure(summary, save=tmp_path / "throughput"),
        "speedup": plots.speedup_figure(analysis.compare_precisions(summary), None, save=tmp_path / "speedup"),
        "loss": plots.loss_figure(runs, save=tmp_path / "loss"),
        "mfu": plots.mfu_figure(summary, save=tmp_path / "mfu"),
        "cost": plots.cost_figure(analysis.cost_table(summary), save=tmp_path / "cost.png"),
        "scaling": plots.scaling_figure(analysis.scaling_table(summary), save=tmp_path / "scaling"),
        "profile": plots.profile_figure(analysis.load_profiles([]), save=tmp_path / "profile"),
    }
    for name, fig in figs.items():
        assert isinstance(fig, Figure)
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (tmp_path / f"{name}.svg").read_bytes()[:400]
        assert _texts(fig), f"{name}: an empty figure must say why it is empty"


def test_profiles_of_real_runs_become_stacked_bars_with_the_wall_time(tmp_path):
    """Two trainer runs recorded with --profile-steps (CPU: op self times): one bar per run whose
    segments are the categories' ms, and the unprofiled step time as a tick; a flagged profile is
    left out unless asked for."""
    import json

    from fp8lab.train.entry import TrainConfig, train

    tok = tmp_path / "tok"
    from fp8lab.data import tokens as fdata

    fdata.prepare_data(None, tok, None, vocab_size=512)
    for prec, backend in (("bf16", "none"), ("fp8", "emulated")):
        train(TrainConfig(model="llama-tiny", seq_len=32, micro_batch_size=2, compute_dtype="fp32", steps=4,
                          profile_steps=(4,), precision=prec, backend=backend, checkpoint_every=-1, save_model=False,
                          plot=False, progress="off", print_metrics=False, data=str(tok),
                          output_dir=str(tmp_path / "runs" / prec)))
    prof = analysis.load_profiles(tmp_path / "runs")
    assert sorted(prof["run_id"].unique()) == ["bf16", "fp8"]
    fp8 = prof[prof["run_id"] == "fp8"]
    assert fp8["variant"].iloc[0] == "fp8 emulated delayed fused" and fp8["layout"].iloc[0] == "2x32"
    saved = json.loads((tmp_path / "runs" / "fp8" / "profile.json").read_text())
    assert dict(zip(fp8["category"], fp8["ms"])) == pytest.approx(saved["categories_ms"])
    ax = plots.profile_figure(prof).axes[0]
    for y, run in enumerate(["bf16", "fp8"]):  # sorted by precision within the model
        widths = [p.get_width() for p in _bars(ax) if abs(p.get_y() + p.get_height() / 2 - y) < 1e-6]
        assert sum(widths) == pytest.approx(prof[prof["run_id"] == run]["ms"].sum())
    ticks = [l for l in ax.lines if l.get_label() in ("step wall time", "_child0") or len(l.get_xdata()) == 2]
    assert len(ticks) == 2
    assert analysis.load_profiles(tmp_path / "runs" / "fp8" / "metrics.jsonl")["run_id"].unique().tolist() == ["fp8"]
    flagged = prof.assign(note=["old categoriser" if r == "fp8" else "" for r in prof["run_id"]])
    assert len(plots.profile_figure(flagged).axes[0].get_yticklabels()) == 1
    assert len(plots.profile_figure(flagged, include_flagged=True).axes[0].get_yticklabels()) == 2


def test_bad_scale_axis_is_rejected(tables):
    _, summary, _ = tables
    with pytest.raises(ValueError, match="by='gpus'"):
        plots.throughput_figure(summary, by="gpus")


def test_the_parity_figure_draws_each_run_and_the_band_from_the_committed_study():
    """Notebook 05 and the report: the committed loss-parity study's BF16 seeds as one shaded range around their
    dashed mean (four seeds would be four more lines), each FP8 run a solid line over validation loss, and their gap
    to the BF16 mean inside the band; nothing committed: a note."""
    from fp8lab import analysis
    from fp8lab.views import plots

    curves = analysis.parity_curves(analysis.load_runs(RESULTS_DIR / "loss-parity-20m"))
    fig = plots.parity_figure(curves)
    top, bottom = fig.axes[:2]
    assert len(top.get_lines()) == 6 and {t.get_text() for t in top.get_legend().get_texts()} == {
        "BF16: range of 4 seeds", "BF16: their mean", "FP8 delayed (seed 1234)", "FP8 delayed (seed 4321)",
        "FP8 delayed (seed 2025)", "FP8 current (seed 1234)", "FP8 current (seed 4321)"}
    bf16 = curves[curves["precision"] == "bf16"].pivot_table(index="step", columns="run_id", values="val_loss")
    assert top.get_lines()[0].get_ydata()[-1] == pytest.approx(bf16.mean(axis=1).iloc[-1])  # the mean, dashed
    assert len(top.collections) == 1 and len(bottom.get_lines()) == 5 + 1  # the range; 5 FP8 gaps and the zero line
    assert len(bottom.collections) == 1  # the band
    empty = plots.parity_figure(analysis.parity_curves(pd.DataFrame()))
    assert "two or more BF16 seeds" in empty.axes[0].texts[0].get_text()
