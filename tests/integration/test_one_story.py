"""Every view tells one story: the headline numbers and figures of the README, docs/results.md, the HTML report and
notebook 05 come from one ``analysis.Answer`` (and the blog-gap study from one table), and a difference between any
two fails here. The answer's own rendering per view is checked in test_one_answer.py; this file checks what crosses
views: the figures' numbers, the verdict's text, the "why faster than the blog" numbers."""
from __future__ import annotations

import re

import pytest

from fp8lab import analysis
from fp8lab.analysis import blog_gap
from fp8lab.core.paths import REPO_ROOT
from fp8lab.notebooks import read_glued, run
from fp8lab.views import plots, report
from committed_answer import committed_answer


def _texts(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def _results_doc() -> str:
    return (REPO_ROOT / report.RESULTS_MD).read_text(encoding="utf-8")


def _main_rows():
    rows = committed_answer().rows
    return rows[rows["gpu_name"] == analysis.answer.main_gpu(rows)]


def test_report_figures_draw_the_answers_speedups():
    """The report's speed-up figure once showed llama-1b's off-by-default FP8-head run (1.36x) beside the 1.34x of its
    own table: it now draws the answer's pairs; its headline figure is the README's; the scaling figure's GPU ticks
    are whole numbers."""
    figs = dict((alt.split(":")[0].split(" (")[0], fig) for fig, alt in report.report_figures(analysis.load_runs()))
    speedup = next(f for k, f in figs.items() if k.startswith("FP8 speedup per model"))
    drawn = sorted(t for t in _texts(speedup) if re.fullmatch(r"\d+\.\d\dx", t))
    assert drawn == sorted(f"{s:.2f}x" for s in _main_rows()["speedup"].dropna())
    headline = next(f for k, f in figs.items() if k.startswith("tokens/s/GPU relative to the best BF16 run"))
    titles = [ax.get_title() for ax in headline.axes if ax.get_title()]
    assert titles and all(t.split(" ")[0] in set(_main_rows()["model"]) for t in titles)  # the main GPU's panels only
    rows = committed_answer().rows
    others = set(rows["gpu_name"]) - {analysis.answer.main_gpu(rows)}  # (the H200 beside P5's H100)
    assert not any(g in t for t in titles for g in others), titles
    scaling = next(f for k, f in figs.items() if k.startswith("per-GPU scaling efficiency"))
    ticks = scaling.axes[0].get_xticks()
    assert len(ticks) and all(float(t).is_integer() for t in ticks), ticks


def _blog_table():
    summary = analysis.summarize_runs(analysis.load_runs())
    return blog_gap.blog_gap_table(summary, analysis.load_reference())


def test_why_faster_than_the_blog_quotes_one_table():
    """The README's bullet and docs/results.md's table quote the blog-gap table of the committed runs."""
    table = _blog_table()
    assert len(table) == len(blog_gap.STEPS)  # every step's two result files are committed
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8").split(report.README_BEGIN)[1].split(report.README_END)[0]
    bullet = next(line for line in readme.splitlines() if line.startswith("- **Why faster than the blog**"))
    assert bullet == f"- **Why faster than the blog**: {blog_gap.sentence(table)}"
    first, last = table.iloc[0], table.iloc[-1]
    assert f"{first['speedup']:.2f}x at {first['step']}" in bullet and f"{last['speedup']:.2f}x at {last['step']}" in bullet
    section = _results_doc().split("## Why faster than the blog")[1].split("## Caveats")[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "**" in line]
    assert [re.search(r"\*\*([\d.]+)x\*\*", r)[1] for r in rows] == [f"{v:.2f}" for v in table["speedup"]]
    # the study's point: the plain layout gains about the blog's figure, the resolver's layout far more
    assert first["speedup"] < first["source_speedup"] + 0.05 < last["speedup"]


@pytest.mark.slow
def test_notebook_05_tells_the_docs_story(tmp_path):
    """Notebook 05 with its defaults: its verdict bullets are docs/results.md's (and so the report's), its headline
    figure draws the README's panels (the main GPU's), and its blog-gap chart the same steps."""
    res = run(["05"], {}, output_dir=tmp_path, progress=False)
    text = res[0].output.read_text()
    import json

    nb = json.loads(text)
    shown = "\n".join("".join(o["data"]["text/markdown"]) for c in nb["cells"] for o in c.get("outputs", [])
                      if "text/markdown" in o.get("data", {}))
    verdict = _results_doc().split("## Verdict")[1].split("## Why faster than the blog")[0]
    bullets = [line for line in verdict.splitlines() if line.startswith("- ")]
    assert bullets and all(b in shown.splitlines() for b in bullets)
    figs = [o["metadata"]["fp8lab"] for c in nb["cells"] for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    headline = next(f for f in figs if f["title"].startswith("Tokens/s/GPU relative to the best BF16 run"))
    summary = analysis.summarize_runs(analysis.load_runs())
    docs = plots.figure_stats(plots.headline_figure(analysis.answer.on_main_gpu(analysis.best_runs(summary),
                                                                                committed_answer().rows),
                                                    analysis.load_reference()))  # docs/headline.png's figure
    assert (headline["bars_per_panel"], headline["title"]) == (docs["bars_per_panel"], docs["title"])
    glued = read_glued(res[0].output)
    assert [r["speedup"] for r in glued["blog_gap"]] == pytest.approx(list(_blog_table()["speedup"]))
