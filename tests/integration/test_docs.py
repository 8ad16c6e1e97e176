"""The README's results block, docs/results.md and docs/headline.png are generated from data/results/
by `fp8lab report --docs`: the committed copies must equal what the command makes now, and the README
must lead with the answer (short, the two commands, the figure, a table of at most 8 rows)."""
from __future__ import annotations

import shutil
import struct
import subprocess
import sys

from fp8lab import analysis
from fp8lab.views import plots, report
from fp8lab.core.paths import REPO_ROOT

README = REPO_ROOT / "README.md"


_CACHE: dict = {}


def _generated():
    if not _CACHE:  # rendering loads every result file: once per test session
        _CACHE.update(report.render_docs(readme=README.read_text(encoding="utf-8")))
    return _CACHE


def test_committed_results_block_and_results_doc_are_current():
    docs = _generated()
    hint = "stale: run `fp8lab report --docs` and commit the result"
    assert README.read_text(encoding="utf-8") == docs["README.md"], f"README.md results block {hint}"
    assert (REPO_ROOT / report.RESULTS_MD).read_text(encoding="utf-8") == docs[report.RESULTS_MD], f"{report.RESULTS_MD} {hint}"
    from fp8lab.plan import evidence  # the plan's evidence, package data written by the same command

    assert (REPO_ROOT / evidence.DOC).read_text(encoding="utf-8") == docs[evidence.DOC], f"{evidence.DOC} {hint}"


def test_committed_headline_png_is_the_generated_figure_and_readable():
    fig = _generated()[report.HEADLINE_PNG]
    stats = plots.figure_stats(fig, dpi=report.HEADLINE_DPI)
    png = (REPO_ROOT / report.HEADLINE_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (stats["width_px"], stats["height_px"])
    assert stats["width_px"] <= 1600 and stats["height_px"] <= 900
    assert max(stats["bars_per_panel"]) <= 12 and stats["legend_entries"] <= 8


def test_readme_leads_with_the_answer():
    text = README.read_text(encoding="utf-8")
    lines = text.splitlines()
    assert len(lines) < 150
    first_screen = "\n".join(lines[:40])
    assert "bash scripts/setup.sh && .venv/bin/fp8lab notebooks run" in first_screen
    assert 'bash scripts/setup.sh && .venv/bin/python -m pytest -m "not slow"' in first_screen
    assert f"]({report.HEADLINE_PNG})" in first_screen
    block = text.split(report.README_BEGIN)[1].split(report.README_END)[0]
    rows = [l for l in block.splitlines() if l.startswith("| ") and not l.startswith("| model ")]
    assert 1 <= len(rows) <= 10  # one row per model measured: readable at a glance
    headline = analysis.headline_table(analysis.summarize_runs(analysis.load_runs()), reference=analysis.load_reference())
    main = analysis.answer.main_gpu(headline)  # the README's rows are of one GPU (session 26: P5's H100 rows beside them)
    assert [r.split("|")[1].strip() for r in rows] == list(headline.loc[headline["gpu_name"] == main, "model"])
    # the source's figures sit in the rows of the models of their size, labelled as reported
    assert "1.13x" in [r for r in rows if r.startswith("| llama-1b ")][0]
    # the README's rows are P5's GPU (an H100): llama-7b, measured on an H200 only until it fits one H100, keeps its
    # labelled row (and the source's 7B figure) in docs/results.md
    seven = [r for r in rows if r.startswith("| llama-7b ")] or [
        r for r in (REPO_ROOT / report.RESULTS_MD).read_text(encoding="utf-8").splitlines() if r.startswith("| llama-7b ")]
    assert "1.18x" in seven[0]
    assert "not measured here" in block


def test_docs_command_writes_into_a_checkout(tmp_path):
    shutil.copy(README, tmp_path / "README.md")
    written = report.write_docs(root=tmp_path)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "README.md", "data/results-index.json", "docs/headline.png", "docs/results.md", "fp8lab/plan/evidence.json"]
    assert (tmp_path / "fp8lab" / "plan" / "evidence.json").read_text() == (REPO_ROOT / "fp8lab/plan/evidence.json").read_text()
    assert (tmp_path / "README.md").read_text() == README.read_text()  # the committed one is current
    (tmp_path / "docs" / "results.md").unlink()
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "report", "--docs", "--docs-root", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "results.md" in proc.stdout, proc.stderr
    assert (tmp_path / "docs" / "results.md").read_text() == (REPO_ROOT / report.RESULTS_MD).read_text()
    (tmp_path / "README.md").write_text("# no markers here\n")
    proc = subprocess.run([sys.executable, "-m", "fp8lab", "report", "--docs", "--docs-root", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and "markers" in proc.stderr


def test_render_docs_needs_the_markers():
    import pytest

    with pytest.raises(ValueError, match="results block markers"):
        report.render_docs(readme="# README without the block\n")


def test_the_readmes_library_example_runs_here():
    """README's "library in a few lines" runs as written, on a CPU too (emulated FP8), and its loss trains."""
    import re

    text = README.read_text(encoding="utf-8")
    block = re.search(r"## The library in a few lines\n\n```python\n(.*?)```", text, re.S).group(1)
    ns: dict = {}
    exec(compile(block, "README.md", "exec"), ns)
    assert ns["backend"] in ("te", "emulated", "torchao")
    loss = ns["loss"]
    assert loss.ndim == 0 and 3.0 < float(loss.detach()) < 10.0  # ~ln(vocab) from random weights
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in ns["model"].parameters())
    assert "convert_model" in block and "autocast" in block and len(block.strip().splitlines()) <= 10


def test_fp8lab_help_says_what_each_command_is_for(capsys):
    from fp8lab import cli

    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "thin dispatcher" not in out and "find out whether it pays off" in out
    for name, (_, _, help_) in cli.COMMANDS.items():
        assert name in out and help_.split()[0] in out
    assert "first steps:" in out and "fp8lab train --model llama-tiny" in out
