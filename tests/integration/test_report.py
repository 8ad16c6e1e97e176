"""fp8lab report: one self-contained HTML page (no external src/href), from the CLI and the library."""
from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser

from fp8lab import analysis, cli
from fp8lab.analysis.conclusion import verdict_bullets
from fp8lab.views import report
from fake_runs import make_pair


class _Refs(HTMLParser):
    """Every URL-bearing attribute and every tag name in the page."""

    def __init__(self):
        super().__init__()
        self.urls: list[tuple[str, str, str]] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href", "srcset", "data", "action", "poster") or (value or "").startswith("url("):
                self.urls.append((tag, name, value or ""))


def _parse(text: str) -> _Refs:
    p = _Refs()
    p.feed(text)
    return p


def test_cli_writes_a_self_contained_report(tmp_path, capsys):
    runs = make_pair(tmp_path / "runs", 1000.0, 1250.0, val_every=10)
    out = tmp_path / "site" / "report.html"
    assert cli.main(["report", str(runs / "bf16"), str(runs / "fp8"), "--out", str(out), "--price", "100",
                     "--tokens", "1e9", "--warmup-steps", "5"]) == 0
    assert "wrote" in capsys.readouterr().out
    text = out.read_text()
    refs = _parse(text)
    assert refs.urls, "the figures must be embedded images"
    assert all(v.startswith("data:image/png;base64,") for _, _, v in refs.urls), refs.urls
    assert "link" not in refs.tags and "script" not in refs.tags and "@import" not in text
    imgs = [v for t, n, v in refs.urls if t == "img"]
    assert len(imgs) == 8  # issue 32: + tokens/s/GPU against P5 instances; issue 31: + loss against the BF16 seeds
    for v in imgs:  # each is a real PNG
        assert base64.b64decode(v.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    # the numbers in the page are the analysis's numbers, and the reference is labelled
    summary = analysis.summarize_runs(analysis.load_runs(runs), warmup_steps=5)
    answer = analysis.Answer.of(summary, reference=analysis.load_reference(), tokens=1e9, price_per_instance_hour=100.0)
    loss_runs, _ = analysis.headline_runs(analysis.load_runs(runs), summary, answer.rows)
    bullets = verdict_bullets(answer, analysis.parity_curves(loss_runs), same_loss=answer.time_to_loss(loss_runs))
    block = text.split('<div class="verdict">')[1].split("</div>")[0]
    items = [re.sub(r"</?b>", "**", html.unescape(t)) for t in re.findall(r"<li>(.*?)</li>", block)]
    assert items == [b.removeprefix("- ") for b in bullets] and "**1.25x**" in items[0]
    assert "not measured here" in text and "1.13" in str(analysis.load_reference()["speedup"].tolist())
    assert "$100.00 per instance-hour" in text and "1,000,000,000" in text
    assert str(tmp_path) not in text  # no machine paths in the page


def test_report_with_no_runs_says_so_and_shows_reference(tmp_path):
    empty = tmp_path / "results"
    empty.mkdir()
    out = report.build_report([empty], tmp_path / "r.html")
    text = out.read_text()
    assert "no measured runs yet" in text.lower() and "not measured here" in text
    assert len([1 for t, _, _ in _parse(text).urls if t == "img"]) == 8  # + the parity figure's note (issue 31)


def test_report_bad_source_is_a_clear_error(tmp_path, capsys):
    assert report.main([str(tmp_path / "missing"), "--out", str(tmp_path / "r.html")]) == 1
    assert "missing" in capsys.readouterr().err
    assert not (tmp_path / "r.html").exists()


def test_markdown_table_for_the_readme(tmp_path):
    runs = make_pair(tmp_path / "runs", 1000.0, 1250.0, val_every=10)
    md = tmp_path / "results.md"
    assert report.main([str(runs), "--out", str(tmp_path / "r.html"), "--markdown", str(md)]) == 0
    lines = md.read_text().splitlines()
    assert lines[0].startswith("| model | GPU | GPUs | micro-batch, accumulation | BF16 baseline | FP8 |")
    row = [c.strip() for c in lines[2].strip("|").split("|")]
    assert row[:3] == ["llama-1b", "NVIDIA H200", "1"] and row[4:6] == ["bf16 te", "fp8 te delayed"]
    assert row[3] == analysis.layout_label(analysis.load_runs(runs).iloc[0])
    assert row[6:9] == ["1,000", "1,250", "**1.25x**"] and row[9:11] == ["10.0%", "12.5%"]
    assert "not measured here" in md.read_text()
    assert "Per-GPU scaling" not in md.read_text()  # one scale only: no scaling table


def test_markdown_scaling_table_lists_multi_gpu_runs_against_their_reference(tmp_path):
    from fake_runs import bench as _bench

    _bench(tmp_path, "one", 1000.0, 1, "2026-11-29T10:00:00Z")
    _bench(tmp_path, "two", 955.0, 2, "2026-11-29T10:05:00Z", parallel="fsdp")
    text = report.render_markdown(analysis.load_runs(tmp_path), report.ReportConfig(warmup_steps=2))
    rows = [l for l in text.splitlines() if l.startswith("| llama-1b | fp8 te delayed fused, 4x1024 |")]
    assert len(rows) == 1  # the two-GPU run only; its reference is a column
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    assert cells[2:] == ["2", "955", "1,000", "0.1", "**95.5%**", "95.5%"]


def test_a_users_runs_are_read_once_by_the_report(tmp_path, monkeypatch, capsys):
    """Issue 47: `fp8lab report FOLDER` read each of a user's run files twice (the steps, then the FP8
    statistics); now once per call, and the FP8 statistics still reach the page."""
    import builtins
    import io
    import json
    from pathlib import Path

    from fp8lab.fp8 import stats as fp8stats

    make_pair(tmp_path / "runs")
    with (tmp_path / "runs" / "fp8" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"record": fp8stats.RECORD, "step": 5, "layers": [], "source": "fp8lab"}) + "\n")
    opened: dict = {}
    real = io.open

    def counting(file, *a, **k):
        if isinstance(file, (str, Path)) and str(file).endswith("metrics.jsonl"):
            opened[str(Path(file).resolve())] = opened.get(str(Path(file).resolve()), 0) + 1
        return real(file, *a, **k)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    assert report.main([str(tmp_path / "runs"), "--out", str(tmp_path / "r.html")]) == 0
    monkeypatch.undo()
    assert sorted(Path(k).parent.name for k in opened) == ["bf16", "fp8"] and set(opened.values()) == {1}, opened
    page = (tmp_path / "r.html").read_text()
    assert "<h3>fp8</h3>" in page and "<h3>bf16</h3>" not in page  # the statistics read from the one read
    report.build_report(tmp_path / "runs", tmp_path / "r2.html")  # the API: the same page (its files read afresh)
    assert (tmp_path / "r2.html").read_text().split("</p>", 1)[1] == page.split("</p>", 1)[1]
