"""Prose a person reads: no paragraph over 600 characters in README.md, docs/*.md, the notebooks' Markdown and the
HTML report's text, read as the rendered page's paragraphs and as the source's blocks of lines (the executed
notebooks' displayed Markdown is checked in each notebook's own test)."""
from __future__ import annotations

import html

import pytest

from fp8lab.analysis.conclusion import clauses
from fp8lab.core.paths import REPO_ROOT
from fp8lab.notebooks import list_notebooks
from prose import (MAX_PARAGRAPH, html_paragraphs, line_blocks, markdown_paragraphs, markdown_too_long,
                   notebook_markdown, too_long)


def test_the_checker_finds_a_long_paragraph_and_splits_lists_and_skips_code():
    long = "word " * 130
    md = f"# title\n\n{long}\n\n- short item\n- {long}\n\n```\n{long}\n```\n\n| a |\n|---|\n| {long} |\n\nshort\n"
    paras = markdown_paragraphs(md)
    assert [len(p) > MAX_PARAGRAPH for p in paras] == [True, False, True, False]
    assert len(too_long(paras, "x")) == 2
    assert [len(p) for p in html_paragraphs(f"<h1>t</h1><p>{long}</p><ul><li>a <b>b</b></li></ul>")] == [1, len(long.strip()), 3]


def test_the_checker_reads_as_a_reader_does():
    half = "word " * 70  # 349 characters: two of them make one paragraph over the limit
    # a paragraph wrapped over many lines is one paragraph, as one long line is
    assert markdown_paragraphs(half.replace(" ", "\n", 30) + "\n" + half) == [f"{half.strip()} {half.strip()}"]
    # a list item is one paragraph with its continuation lines and the paragraphs indented under it ...
    item = f"- {half}\n  more\n\n  {half}\n- short\n"
    assert [len(p) for p in markdown_paragraphs(item)] == [len(half.strip()) * 2 + 6, 5]
    # ... but a nested list's items are their own
    nested = f"1. **Step.** {half}\n   - {half}\n   - {half}\n2. next\n"
    assert [len(p) for p in markdown_paragraphs(nested)] == [349, 349, len("Step. ") + 349, 4]  # bold marks are not text
    # a link counts by its text, not its URL; images, comments and code are not prose
    url = "https://example.com/" + "x" * 700
    assert markdown_paragraphs(f"see [the docs]({url}) now\n\n![a figure]({url})\n\n<!-- {half}{half} -->\n\n"
                               f"    {half}{half}\n") == ["see the docs now"]
    # the same rule in HTML: a <li> takes in its <p>s; tables are left out
    page = f"<ul><li><p>{half}</p><p>{half}</p></li></ul><details><summary>s</summary>{half}</details>" \
           f"<table><tr><td>{half}{half}</td></tr></table>"
    assert [len(p) for p in html_paragraphs(page)] == [len(half.strip()) * 2 + 1, 1, len(half.strip())]


def test_the_checker_reads_the_source_as_blocks_of_lines_too():
    item = "word " * 25  # 124 characters: six of them make one block over the limit
    tight = "".join(f"- {item}\n" for _ in range(6))
    loose = "\n".join(f"- {item}\n" for _ in range(6))
    # a tight list: each item short on the page, one 749-character block in the source
    assert markdown_too_long(tight, "x") == too_long(line_blocks(tight), "x (block of lines)") != []
    assert [len(b) for b in line_blocks(tight)] == [6 * 124 + 5]
    assert line_blocks(loose) == [item.strip()] * 6 and markdown_too_long(loose, "x") == []
    # headings, code, tables and the generated blocks' markers end a block and count nothing; link text counts,
    # not the URL; a wrapped paragraph is one block, as the parser reads it
    url = "https://example.com/" + "x" * 700
    md = (f"<!-- generated: do not edit -->\nsee [the docs]({url})\n# a heading\n{item}\n```\n{item}\n```\n"
          f"{item.replace(' ', chr(10), 3)}\n| a |\n|---|\n| {item} |\n\ntail\n<!-- end -->\nmore\n")
    assert line_blocks(md) == ["see the docs", item.strip(), item.strip(), "tail", "more"]
    # a paragraph over the limit is found by both readings
    assert len(markdown_too_long(item * 5, "x")) == 2


@pytest.mark.parametrize("path", ["README.md", *sorted(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "docs").glob("*.md"))])
def test_readme_and_docs_paragraphs_are_short(path):
    long = markdown_too_long((REPO_ROOT / path).read_text(encoding="utf-8"), path)
    assert not long, "\n".join(long)


@pytest.mark.parametrize("path", list_notebooks(), ids=lambda p: p.stem)
def test_notebook_markdown_cells_are_short(path):
    long = markdown_too_long(notebook_markdown(path), path.name)
    assert not long, "\n".join(long)


@pytest.mark.slow
def test_the_html_report_text_is_short():
    from fp8lab import analysis
    from fp8lab.views import report

    runs = analysis.load_runs()
    page = report.render_html(runs)
    long = too_long(html_paragraphs(page), "HTML report")
    assert not long, "\n".join(long)
    # the verdict in full: each model's sentence listed as its clauses, every word of it kept
    per_model, closing = report.Analysed.of(runs, report.ReportConfig()).answer.verdict_parts()
    full = html.unescape(page.split("the verdict in full sentences")[1].split("</details>")[0])
    for sentence in per_model:
        first, *rest = clauses(sentence)
        assert f"<li>{first}" + (":<ul>" + "".join(f"<li>{c}</li>" for c in rest) + "</ul>" if rest else "") in full
        assert "; ".join([first, *rest]) == sentence
    assert all(f"<p>{s}</p>" in full for s in closing)
