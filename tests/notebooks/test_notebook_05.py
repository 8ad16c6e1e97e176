"""Notebook 05 executes for real under papermill: with its defaults (the results committed in
data/results/, possibly none yet) and with a user's own trainer output folders."""
from __future__ import annotations

import struct

import nbformat
import pandas as pd
import pytest

from fp8lab import analysis
from figure_outputs import assert_figures_readable_and_saved, longest_cell_output
from fp8lab.views.cell_text import MAX_CELL_LINES
from fp8lab import notebooks
from fp8lab.notebooks import NOTEBOOK_DIR, NotebookError, declared_parameters, read_glued, run
from prose import assert_notebook_prose_short
from fake_runs import make_pair

NB = NOTEBOOK_DIR / "05_analyze_results.ipynb"


def _images(path) -> int:
    nb = nbformat.read(str(path), as_version=4)
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _figures(path) -> list[tuple[dict, bytes]]:
    """(what fp8lab.views.plots.show recorded about the figure, the PNG itself) for every figure shown."""
    import base64

    nb = nbformat.read(str(path), as_version=4)
    return [(o.get("metadata", {}).get("fp8lab", {}), base64.b64decode(o["data"]["image/png"]))
            for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]


def test_defaults_read_the_committed_results_and_the_reference(tmp_path):
    res = run(["05"], {}, output_dir=tmp_path, progress=False)
    assert_notebook_prose_short(res[0].output)
    vals = read_glued(res[0].output)
    committed = analysis.load_runs()  # whatever is committed now: the notebook must agree with the library
    assert vals["n_runs"] == committed["run_id"].nunique()
    assert vals["reference_speedups"] == {"1B": 1.13, "7B": 1.18}
    summary = analysis.summarize_runs(committed)
    answer = analysis.Answer.of(summary, reference=analysis.load_reference())  # what every view renders
    expected = answer.verdict()
    assert vals["verdict"] == expected and "not measured here" in vals["verdict"]
    assert vals["answer"] == answer.numbers()  # headline, verdict and cost chart: the same numbers
    if vals["n_runs"] == 0:
        assert "no measured BF16/FP8 pairs" in vals["verdict"]
    assert vals["n_profiled_runs"] == analysis.load_profiles()["run_id"].nunique()
    assert vals["detail"] == "headline"
    headline = analysis.headline_table(summary, reference=analysis.load_reference())
    assert vals["headline"] == {m: {"best_bf16": b, "best_fp8": f, "speedup": pytest.approx(s)} for m, b, f, s in
                                zip(headline["model"], headline["bf16_run"], headline["fp8_run"], headline["speedup"])}
    figures = _figures(res[0].output)
    assert len(figures) == 5  # headline, loss study, loss against the BF16 seeds, time and cost, why faster than the blog
    for stats, png in figures:  # readable at a glance: measured on the figures the notebook drew
        width, height = struct.unpack(">II", png[16:24])
        assert (width, height) == (stats["width_px"], stats["height_px"]), stats
        assert width <= 1600 and height <= 900, stats
        assert max(stats["bars_per_panel"], default=0) <= 12 and stats["legend_entries"] <= 8, stats
    assert assert_figures_readable_and_saved(res[0].output, tmp_path / NB.stem) == [
        "headline.png", "loss.png", "parity.png", "cost.png", "blog_gap.png"]
    text = res[0].output.read_text()
    assert "set detail = 'all'" in text
    # every cost beside the price it used and that price's date: the cost table, the verdict
    assert "$113.07/instance-hour, as of 2024-11" in text and "at $113.07/instance-hour, as of 2024-11" in vals["verdict"]
    # a person reads each cell in seconds: the full verdict and headline go to files, bullets and a short table stay
    assert longest_cell_output(res[0].output) <= MAX_CELL_LINES
    assert (tmp_path / NB.stem / "verdict.txt").read_text() == vals["verdict"] + "\n"
    assert len(pd.read_csv(tmp_path / NB.stem / "headline.csv")) == len(headline)
    if vals["n_runs"]:
        for model, speedup in zip(headline["model"], headline["speedup"]):  # one bullet per model, with its number
            if speedup == speedup:
                assert f"**{model}**: FP8 **{speedup:.2f}x**" in text
        from fp8lab.analysis.memory_lesson import peak_memory
        from fp8lab.analysis.time_to_loss import time_to_loss

        memory = peak_memory(answer, summary)  # the memory lesson: measured peaks, from the committed files
        assert len(memory) and all(f"{v:.1f}" in text for v in memory["fp8_gib"])

        loss_runs, _ = analysis.headline_runs(committed, summary, answer.rows)
        for _, t in time_to_loss(answer, loss_runs).iterrows():  # tokens/s and loss together, per loss study
            assert (f"**{t['time_ratio']:.2f}x** BF16's time" if t["fp8_tokens"] == t["fp8_tokens"]
                    else "FP8 did not reach BF16's final validation loss") in text


def test_detail_all_shows_every_run(tmp_path):
    res = run(["05"], {"detail": "all"}, output_dir=tmp_path, progress=False)
    vals = read_glued(res[0].output)
    assert vals["detail"] == "all" and vals["n_runs"] == analysis.load_runs()["run_id"].nunique()
    # headline, loss, loss against the BF16 seeds, cost, why faster than the blog, throughput, speedup, MFU, scaling,
    # profile, long sequences: drawn even with no runs
    assert _images(res[0].output) == 11
    assert len(assert_figures_readable_and_saved(res[0].output, tmp_path / NB.stem)) == 11


def test_filters_narrow_the_runs_and_bad_values_are_named(tmp_path):
    committed = analysis.load_runs()
    model = sorted(committed["model"].dropna().unique())[0]
    res = run(["05"], {"models": [model]}, output_dir=tmp_path, progress=False)
    vals = read_glued(res[0].output)
    assert vals["n_runs"] == committed[committed["model"] == model]["run_id"].nunique()
    assert set(vals["headline"]) == {model}
    with pytest.raises(NotebookError, match="detail='everything'; allowed: 'headline', 'all'"):
        run(["05"], {"detail": "everything"}, output_dir=tmp_path / "bad", progress=False)
    with pytest.raises(NotebookError, match="no runs of llama-99b"):
        run(["05"], {"models": ["llama-99b"]}, output_dir=tmp_path / "bad2", progress=False)


def test_user_run_folders_are_analysed(tmp_path):
    runs = make_pair(tmp_path / "my-runs", 1000.0, 1250.0)
    res = run(["05"], {"runs": [str(runs)], "price_per_hour": 10.0, "tokens": 1e9,
                       "warmup_steps": 5, "smoothing": "window", "smoothing_span": 5, "save_figures": True,
                       "detail": "all"},
              output_dir=tmp_path / "out", progress=False)
    vals = read_glued(res[0].output)
    assert vals["n_runs"] == 2 and vals["run_ids"] == ["bf16", "fp8"] and vals["n_step_records"] == 60
    assert vals["speedups"] == {"fp8": pytest.approx(1.25)}
    assert vals["loss_gaps_pct"] == {"fp8": pytest.approx(3.0)}  # FP8 loss is 1.03x BF16's at every step
    # the answer and every run's cost (detail "all") price the budget as a plan does: one P5 (8 GPUs at
    # the run's rate, no two-GPU runs measured here: efficiency 1.0) plus the 600 s start-up
    hours = {p: (1e9 / (tps * 8) + 600) / 3600 for p, tps in (("bf16", 1000.0), ("fp8", 1250.0))}
    assert vals["cost_usd"] == {"bf16": pytest.approx(10 * hours["bf16"]), "fp8": pytest.approx(10 * hours["fp8"])}
    got = vals["answer"]["llama-1b"]
    assert got["hours_bf16"] == pytest.approx(hours["bf16"]) and got["cost_fp8"] == pytest.approx(10 * hours["fp8"])
    saved = 100 * (1 - hours["fp8"] / hours["bf16"])
    assert "1.25x" in vals["verdict"] and f"{saved:.0f}% saved" in vals["verdict"]
    workdir = tmp_path / "out" / "05_analyze_results"
    assert vals["n_profiled_runs"] == 0  # no --profile-steps in these runs: the figure says so
    for name in ("throughput", "speedup", "loss", "mfu", "profile", "cost", "scaling", "headline"):
        assert (workdir / f"{name}.png").exists() and (workdir / f"{name}.svg").exists()


def test_runs_of_notebook_03_are_analysed(tmp_path):
    """Notebook 03's output: a BF16 and an FP8 trainer folder from fp8lab.trainpair.run_pair (the real
    trainer; tiny Llama on CPU, FP8 emulated, same weights and batches), read by notebook 05."""
    from fp8lab import trainpair

    trainpair.run_pair("llama-tiny", 8, ["emulated"], output_dir=tmp_path / "runs", seq_len=64,
                       micro_batch_size=2, val_batches=1, compute_dtype="fp32", device="cpu", checkpoint_every=-1)
    res = run(["05"], {"runs": [str(tmp_path / "runs")], "warmup_steps": 2}, output_dir=tmp_path / "out",
              progress=False)
    vals = read_glued(res[0].output)
    # the baseline computed in fp32 on the CPU: named for what it is
    assert vals["n_runs"] == 2 and vals["run_ids"] == ["fp32", "fp8-emulated"] and vals["n_step_records"] == 16
    loaded = analysis.summarize_runs(analysis.load_runs(tmp_path / "runs"), warmup_steps=2).set_index("run_id")
    assert loaded.loc["fp8-emulated", "tokens"] == loaded.loc["fp32", "tokens"] == 8 * 2 * 64  # steps x batch x seq
    assert loaded.loc["fp32", "variant"].startswith("fp32 ")
    assert set(vals["speedups"]) == {"fp8-emulated"} and vals["loss_gaps_pct"]["fp8-emulated"] is not None
    # emulated FP8 on a CPU: the loss comparison stands, the speed is not claimed
    assert "not a measurement of FP8 speed" in vals["verdict"] and "validation loss" in vals["verdict"]


def test_notebook_is_thin_and_its_defaults_match_the_library():
    nb = nbformat.read(str(NB), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code)
    assert not any("def " in c.source for c in code)
    params = declared_parameters(NB)
    assert params["runs"] == [] and params["tokens"] == analysis.DEFAULT_TOKEN_BUDGET
    assert params["price_per_hour"] == analysis.DEFAULT_PRICE_PER_INSTANCE_HOUR
    assert not set(notebooks.RENAMED) & set(params)  # one name per quantity: notebook 04's
    assert params["gpus_per_instance"] == analysis.DEFAULT_GPUS_PER_INSTANCE
    assert params["smoothing"] in analysis.SMOOTHING_METHODS
    assert params["detail"] == "headline" and params["detail"] in analysis.DETAILS
    assert params["models"] == [] and params["studies"] == [] and params["variant"] == ""


def test_notebook_03s_runs_are_found_by_the_path_the_parameter_comment_gives(tmp_path):
    """The runs parameter's comment: notebook 03's runs are "../03_train_bf16_vs_fp8/runs". That holds
    from `fp8lab notebooks run` (working folder outputs/05_analyze_results/) and from JupyterLab
    (kernel started in notebooks/, which the notebook's first cell moves to the same folder)."""
    from lab_run import run_from_notebooks_folder

    from fp8lab import trainpair

    cells = nbformat.read(str(NB), as_version=4).cells
    source = next(c.source for c in cells if "parameters" in c.metadata.get("tags", []))
    comment = next(line for line in source.splitlines() if line.startswith("runs ="))
    assert '"../03_train_bf16_vs_fp8/runs"' in comment
    trainpair.run_pair("llama-tiny", 4, ["emulated"], output_dir=tmp_path / "outputs" / "03_train_bf16_vs_fp8" / "runs",
                       seq_len=32, micro_batch_size=2, val_batches=1, compute_dtype="fp32", device="cpu",
                       checkpoint_every=-1)
    params = {"runs": ["../03_train_bf16_vs_fp8/runs"], "warmup_steps": 1}
    res = run(["05"], params, output_dir=tmp_path / "outputs", progress=False)
    # on a CPU the baseline computes in fp32 and is named so (trainpair)
    assert read_glued(res[0].output)["run_ids"] == ["fp32", "fp8-emulated"]
    assert run_from_notebooks_folder(tmp_path, "05_analyze_results", params)["run_ids"] == ["fp32", "fp8-emulated"]
