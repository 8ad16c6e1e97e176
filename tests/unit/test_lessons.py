"""What the notebooks teach is right (issue 29, item 4): the saturation lesson of notebook 01 matches
the numerics, CPU runs are named for the precision they computed in, the source is named with its
title and link, and notebook 03's loss figure shows every curve."""
from __future__ import annotations

import json

import nbformat
import pytest
import torch

from fp8lab import analysis
from fp8lab.fp8 import formats as F
from fp8lab.notebooks import NOTEBOOK_DIR
from fp8lab.core.paths import DATA_DIR, REPO_ROOT


def _markdown(nb: str) -> str:
    return "\n".join(c.source for c in nbformat.read(str(NOTEBOOK_DIR / nb), as_version=4).cells
                     if c.cell_type == "markdown")


def test_saturation_error_flattens_at_100_percent_as_notebook_01_says():
    for fmt in (F.E4M3, F.E5M2):
        x = torch.tensor([2 * fmt.max, 1000 * fmt.max, 1e6 * fmt.max])
        rel = ((F.quantize(x, fmt) - x).abs() / x).tolist()
        assert rel == pytest.approx([0.5, 0.999, 1 - 1e-6], abs=1e-3)  # rises towards 100%, never past it
    text = _markdown("01_fp8_formats.ipynb")
    assert "without bound" not in text and "flattening at 100%" in text


def test_source_is_named_with_its_title_and_link():
    ref = json.loads((DATA_DIR / "reference" / "source_blog.json").read_text())
    assert ref["url"].startswith("https://aws.amazon.com/blogs/machine-learning/")
    link = f"[“{ref['title']}”]({ref['url']})"
    assert link in analysis.source_link()
    for name, text in (("README.md", (REPO_ROOT / "README.md").read_text()),
                       ("notebook 01", _markdown("01_fp8_formats.ipynb")),
                       ("notebook 05", _markdown("05_analyze_results.ipynb"))):
        assert link in text, name


@pytest.mark.parametrize("row, label", [
    ({"precision": "bf16", "backend": "hf", "gpu_name": "cpu", "compute_dtype": "fp32"}, "fp32 hf"),  # what ran
    # an old folder's config.json said "auto": its normalised form says what ran (fp32 on a CPU)
    ({"precision": "bf16", "backend": "hf", "gpu_name": "cpu", "compute_dtype": "auto"}, "fp32 hf"),
    ({"precision": "bf16", "backend": "hf", "gpu_name": "cpu", "compute_dtype": "bf16"}, "bf16 hf"),  # as asked
    ({"precision": "bf16", "backend": "te", "gpu_name": "NVIDIA H200", "compute_dtype": "fp32"}, "fp32 te"),
    ({"precision": "bf16", "backend": "te", "gpu_name": "NVIDIA H200", "compute_dtype": "auto"}, "bf16 te"),
    ({"precision": "fp8", "backend": "emulated", "recipe": "delayed", "gpu_name": "cpu"}, "fp8 emulated delayed"),
])
def test_cpu_runs_are_named_for_the_precision_they_computed_in(row, label):
    from fp8lab.analysis.run_config import normalize_config

    assert analysis.variant_label(normalize_config(row)) == label


def test_pair_figure_shows_every_curve():
    import pandas as pd

    from fp8lab import trainpair

    losses = {"fp32": [5.0 - 0.01 * i for i in range(40)], "fp8 emulated": [5.0 - 0.01 * i for i in range(40)]}
    table = pd.DataFrame({"tokens_per_sec_per_gpu": [100.0, 90.0], "speedup_vs_bf16": [1.0, 0.9],
                          "backend": ["none", "emulated"], "final_val_loss": [4.6, 4.61]}, index=["fp32", "fp8 emulated"])
    pair = trainpair.PairResult({k: None for k in losses}, {}, table, "cpu", "", losses)
    fig = trainpair.pair_figure(pair)
    ax = fig.axes[0]
    # emulated on a CPU: the right panel is the loss the runs measured, no speed-up ratio drawn
    assert [t.get_text() for t in fig.axes[2].texts] == ["4.600", "4.610"]
    smoothed = [l for l in ax.lines if l.get_label() in losses]
    assert len(smoothed) == 2  # identical curves: told apart by line style and markers, baseline on top
    assert len({l.get_linestyle() for l in smoothed}) == 2 and len({l.get_marker() for l in smoothed}) == 2
    top = max(smoothed, key=lambda l: l.get_zorder())
    assert top.get_label() == "fp32"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fp32", "fp8 emulated"]
