"""One self-contained HTML page of the BF16-vs-FP8 analysis: verdict, figures, tables.

Images are embedded as base64 PNG and styles inline, so the page has no external ``src`` or
``href`` and opens offline (attach it to an issue, mail it, open it on a laptop).
``fp8lab report RUNS... --out report.html`` calls :func:`main`.
"""
from __future__ import annotations

import base64
import functools
import html
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable

import pandas as pd

from fp8lab import analysis
from fp8lab.analysis.index import (INDEX_DOC, SUMMARY_DEFAULTS, committed_index, committed_summary,
                                   is_committed_results,
                                   render_index)
from fp8lab.analysis import blog_gap
from fp8lab.analysis.conclusion import clauses, verdict_bullets
from fp8lab.analysis.scaling import answer_at_scale
from fp8lab.analysis.time_to_loss import sentence, time_to_loss
from fp8lab.analysis.estimates import price_words
from fp8lab.core.hardware import gpu_label
from fp8lab.core.prices import price_arg, price_of
from fp8lab.core.paths import REPO_ROOT, RESULTS_DIR, files_read_once
from fp8lab.core.probes import check_writable_file, refuse_replacing
from fp8lab.core.progress import Counter
from fp8lab.core.validate import OneLineParser, nonneg_int, positive_float, positive_int
from fp8lab.analysis import fp8_stats as health_reader
from fp8lab.fp8 import stats as fp8stats
from fp8lab.plan import evidence
from fp8lab.records import ownership
from fp8lab.views import plots
from fp8lab.views.html_table import table as _table
from fp8lab.views.caveats import CAVEATS
from fp8lab.views.run_tables import (MARKDOWN_COLUMNS, comparison_markdown, peers_markdown,  # noqa: F401
                                     peers_sentence, runs_markdown, scaling_markdown)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;max-width:1100px;\
margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{font-size:1.25em;margin-top:1.6em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}\
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
.verdict{background:#f6f8fa;border-left:4px solid #d9822b;padding:.8em 1em}.verdict li{margin:.4em 0}
.ref{color:#a3162b}.muted{color:#666;font-size:.9em}img{max-width:100%;height:auto}
.wide{overflow-x:auto;max-width:100%}td{overflow-wrap:anywhere}details{margin:.3em 0}summary{cursor:pointer;color:#245}
"""


@dataclass(frozen=True)
class ReportConfig:
    """What the report assumes; every value is printed in the page."""

    tokens: float = analysis.DEFAULT_TOKEN_BUDGET  # token budget for time/cost (source's epoch: 24B)
    price_per_instance_hour: object = analysis.DEFAULT_PRICE_PER_INSTANCE_HOUR  # USD (an assumption), or a dated Price
    gpus_per_instance: int = analysis.DEFAULT_GPUS_PER_INSTANCE  # P5: 8
    warmup_steps: int = 10  # steps left out of steady-state throughput
    smoothing: str = "ema"  # "ema", "window" or "none"
    smoothing_span: int = 20  # EMA span or window length, in logged steps
    title: str = "fp8lab: BF16 vs FP8 training results"


_DRAWN: list = []  # the progress counter of the page being drawn (fp8lab.core.progress.Counter), if any


def _img(fig, alt: str) -> str:
    data = base64.b64encode(plots.to_png(fig)).decode("ascii")
    for counter in _DRAWN:
        counter.tick()
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


# The runs table: what a reader needs first; the rest of each run on request (<details>).
RUN_COLUMNS = ["run_id", "model", "variant", "layout", "world_size", "tokens_per_sec_per_gpu", "mfu", "val_loss"]
RUN_DETAIL_COLUMNS = ["run_id", "study", "gpu_name", "instances", "n_steps", "tokens", "tps_spread_pct", "max_mem_gib",
                      "final_loss", "smoothed_loss", "nonfinite_losses", "throughput_from", "note"]
PAIR_COLUMNS = ["model", "world_size", "layout", "baseline_variant", "fp8_variant", "speedup", "val_loss_gap_pct"]
PAIR_DETAIL_COLUMNS = ["model", "layout", "baseline_run", "fp8_run", "tps_baseline", "tps_fp8", "mfu_baseline",
                       "mfu_fp8", "tokens_baseline", "tokens_fp8", "valid", "loss_gap_pct", "note"]
ANSWER_HTML_COLUMNS = {"model": "model", "gpu_name": "GPU", "bf16_variant": "best BF16", "tps_bf16": "tokens/s/GPU",
                       "fp8_variant": "best FP8", "tps_fp8": "tokens/s/GPU ", "speedup": "speedup",
                       "mfu_bf16": "BF16 MFU", "mfu_fp8": "FP8 MFU", "loss_gap_pct": "FP8 loss gap %",
                       "cost_bf16": "BF16 cost (time)", "cost_fp8": "FP8 cost (time)"}
SHOWN_ROWS = 12  # rows of a table shown at once; the rest on request


def _details(summary: str, inner: str) -> str:
    return f"<details><summary>{html.escape(summary)}</summary>{inner}</details>"


def _long_table(df: pd.DataFrame, first: list[str], rest: list[str], what: str) -> str:
    """The first ``SHOWN_ROWS`` rows in the columns a reader needs first; every row and the other
    columns on request."""
    if not len(df):
        return _table(df)
    out = _table(df.head(SHOWN_ROWS), first)
    if len(df) > SHOWN_ROWS:
        out += _details(f"all {len(df)} {what}", _table(df, first))
    return out + _details(f"more columns of the {what}", _table(df, rest))


def _at_scale(answer) -> pd.DataFrame:
    return answer_at_scale(answer)


def render_html(runs: pd.DataFrame, config: ReportConfig = ReportConfig(),
                reference: pd.DataFrame | None = None, health: dict | None = None,
                summary: pd.DataFrame | None = None, analysed: "Analysed | None" = None) -> str:
    """The report page for a runs table from :func:`fp8lab.analysis.load_runs`; ``health``: run_id -> its
    FP8 statistics (fp8lab.analysis.fp8_stats.of_sources; default: found through the runs' sources); ``summary``: the
    runs' per-run summary at ``config``'s settings, if already made (e.g. the results index's); ``analysed``:
    their analysis at ``config``'s settings, if already made."""
    with Counter("drawing the report", unit="figure") as counter:
        _DRAWN.append(counter)
        try:
            return _render_html(runs, config, reference, health, summary, analysed)
        finally:
            _DRAWN.remove(counter)


def report_figures(runs: pd.DataFrame, config: "ReportConfig" = None, analysed: "Analysed | None" = None) -> list:
    """The report's figures for a runs table, each with its alt text: [(Figure, alt), ...] (the FP8 health
    heatmaps aside). The figure check of the tests draws these."""
    config = config or ReportConfig()
    a = analysed or Analysed.of(runs, config)
    summary, answer = a.summary, a.answer
    scaling = a.scaling
    loss_runs, _ = analysis.headline_runs(runs, summary, answer.rows)
    best = analysis.best_runs(summary)
    shown = summary[summary["run_id"].isin(best["run_id"])]
    main = analysis.answer.on_main_gpu(answer.rows, answer.rows)  # the answer's pairs: the speed-ups its table quotes
    return [
        (plots.headline_figure(analysis.answer.on_main_gpu(best, answer.rows), a.reference),
         "tokens/s/GPU relative to the best BF16 run, per model: the figure of the README and notebook 05"),
        (plots.speedup_figure(main, reference=a.reference),
         "FP8 speedup per model (the answer's pairs), with the source's reported values"),
        (plots.loss_figure(loss_runs, config.smoothing, config.smoothing_span),
         "loss curves and FP8 gap of each loss study"),
        (plots.parity_figure(analysis.parity_curves(loss_runs)),
         "validation loss against the BF16 seeds' mean and the band of their spread"),
        (plots.mfu_figure(shown), "MFU of the best run of each kind per model"),
        (plots.cost_figure(answer.costs()), "time and cost to train the token budget, best BF16 against best FP8"),
        (plots.scaling_figure(scaling), "per-GPU scaling efficiency"),
        (plots.instances_figure(_at_scale(answer), a.reference),
         "modelled tokens/s/GPU against P5 instances (fp8lab.analysis.scaling; not measured past two GPUs)"),
    ]


def _render_html(runs: pd.DataFrame, config: ReportConfig, reference: pd.DataFrame | None, health: dict | None,
                 summary: pd.DataFrame | None, analysed: "Analysed | None" = None) -> str:
    a = analysed or Analysed.of(runs, config, reference, summary)
    summary, comparison, answer = a.summary, a.comparison, a.answer
    costs = analysis.cost_table(summary, config.tokens, answer.price, config.gpus_per_instance,
                                estimate=answer.estimate)
    scaling = a.scaling
    parts = _verdict(runs, a)
    figs = report_figures(runs, config, a)
    n_runs = summary["run_id"].nunique()
    e = html.escape
    r = answer.rows
    rows = r.assign(speedup=[("-" if pd.isna(v) else f"{v:.2f}x") for v in r["speedup"]],
                    mfu_bf16=r["mfu_bf16"].map(_pct), mfu_fp8=r["mfu_fp8"].map(_pct),
                    loss_gap_pct=["-" if pd.isna(v) else f"{v:+.2f}" for v in r["loss_gap_pct"]],
                    cost_bf16=["-" if pd.isna(v) else f"${v:,.0f} ({h:,.1f} h)"
                               for v, h in zip(r["cost_bf16"], r["hours_bf16"])],
                    cost_fp8=["-" if pd.isna(v) else f"${v:,.0f} ({h:,.1f} h)"
                              for v, h in zip(r["cost_fp8"], r["hours_fp8"])])
    body = [
        f"<h1>{e(config.title)}</h1>",
        f'<p class="muted">Generated {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC by fp8lab from {n_runs} measured '
        f"run(s). Assumptions: token budget {config.tokens:,.0f}; price {e(price_words(answer.price, full=True))} "
        f"with {config.gpus_per_instance} GPUs per instance; "
        f"{config.warmup_steps} warm-up steps excluded; loss smoothing {e(config.smoothing)}, span "
        f"{config.smoothing_span}.</p>",
        "<h2>Verdict</h2>", _verdict_html(parts),
        _details("the verdict in full sentences, per BF16/FP8 pair", _verdict_in_full(answer)),
        "<h2>The answer per model</h2>",
        f'<p class="muted">Best BF16: {e(analysis.answer.WHY_BF16)}; best FP8: {e(analysis.answer.WHY_FP8)}. '
        f"Cost: {analysis.fmt_tokens(config.tokens)} tokens on one {e(answer.instance_type)}, as fp8lab launch plan "
        "estimates it from these runs.</p>",
    ]
    main = analysis.answer.main_gpu(rows, answer.instance_type)  # P5's GPU first; the other GPUs' rows on request
    on_main = rows["gpu_name"] == main if main else pd.Series(True, index=rows.index)
    answer_table = functools.partial(_table, columns=list(ANSWER_HTML_COLUMNS.values()))
    body.append(answer_table(rows[on_main].rename(columns=ANSWER_HTML_COLUMNS)))
    if (~on_main).any():
        body.append(_details(f"the {int((~on_main).sum())} rows measured on other GPUs",
                             answer_table(rows[~on_main].rename(columns=ANSWER_HTML_COLUMNS))))
    if not n_runs:
        body.append('<p class="muted">There are no measured runs yet; only the source\'s reported figures are '
                    'shown.</p>')
    body.append("<h2>Figures</h2>")
    body += [_img(f, alt) for f, alt in figs]
    body += _health_section(health_reader.of_runs(runs) if health is None else health)
    runs_table = summary.assign(layout=[analysis.layout_label(r) for _, r in summary.iterrows()])
    body += [
        "<h2>FP8 vs BF16 per model and scale</h2>",
        '<p class="muted">Loss gaps only between runs that saw the same number of tokens (column valid).</p>',
        _long_table(comparison, PAIR_COLUMNS, PAIR_DETAIL_COLUMNS, "BF16/FP8 pairs"),
        "<h2>Per-GPU scaling</h2>",
        '<p class="muted">Each multi-GPU run against the same set-up on the smallest scale, measured closest in '
        "time (efficiency) and the fastest such run (efficiency_vs_fastest).</p>",
        _long_table(scaling, ["model", "variant", "world_size", "efficiency", "efficiency_vs_fastest"],
                    ["run_id", "reference_run_id", "tokens_per_sec_per_gpu", "reference_tokens_per_sec_per_gpu",
                     "hours_apart"], "scaling rows"),
        "<h2>Runs</h2>",
        _long_table(runs_table, RUN_COLUMNS, RUN_DETAIL_COLUMNS, "runs"),
        _details("provenance of every run", _table(summary, ["run_id", "source", *analysis.PROVENANCE_COLUMNS])),
        "<h2>Time and cost of every run</h2>",
        f'<p class="muted">The budget on one {e(answer.instance_type)} resting on each run, estimated as the answer '
        "above and fp8lab launch plan estimate a job; runs no estimate rests on (several GPUs, a CPU, emulated FP8) "
        "say why in cost_note. projected = the run used fewer GPUs than the instance priced here.</p>",
        _long_table(costs, ["run_id", "model", "variant", "hours", "cost_usd"],
                    ["run_id", "instances", "cluster_gpus", "tokens_per_sec_per_gpu", "projected", "cost_note"],
                    "costs"),
        '<h2 class="ref">Source blog figures (reported by the source, not measured here)</h2>',
        f"<p>{_md_link_html(analysis.source_link())}</p>",
        _table(a.reference),
    ]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">" + GENERATOR_META +
            f"<title>{e(config.title)}</title><style>{_CSS}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def _verdict(runs: pd.DataFrame, a: "Analysed") -> list[str]:
    """The verdict as Markdown bullets (:func:`fp8lab.analysis.conclusion.verdict_bullets`): a bullet per model, the
    conclusion and the source's figures; the same bullets as notebook 05's, each a line a person reads."""
    loss_runs, _ = analysis.headline_runs(runs, a.summary, a.answer.rows)
    return verdict_bullets(a.answer, analysis.parity_curves(loss_runs), same_loss=a.answer.time_to_loss(loss_runs))


def _verdict_html(bullets: list[str]) -> str:
    """The verdict's bullets as a list; their Markdown bold as bold."""
    import re

    items = "".join("<li>" + re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", html.escape(b.removeprefix("- "))) + "</li>"
                    for b in bullets)
    return f'<div class="verdict"><ul>{items}</ul></div>'


def _verdict_in_full(answer) -> str:
    """The verdict's sentences (``Answer.verdict_parts``) a person can read: a list item per model, its clauses
    under it, then the closing sentences as paragraphs."""
    per_model, closing = answer.verdict_parts()
    e = html.escape
    sub = ["".join(f"<li>{e(x)}</li>" for x in c[1:]) for c in map(clauses, per_model)]
    items = "".join(f"<li>{e(c[0])}" + (f":<ul>{s}</ul>" if s else "") + "</li>"
                    for c, s in zip(map(clauses, per_model), sub))
    return f"<ul>{items}</ul>" + "".join(f"<p>{e(s)}</p>" for s in closing)


def _md_link_html(markdown: str) -> str:
    """A Markdown ``[text](url)`` as HTML text naming the address (the page links nowhere: it opens offline)."""
    import re

    m = re.search(r"\[(.*?)\]\((.*?)\)", markdown)
    if not m:
        return html.escape(markdown)
    return html.escape(markdown[:m.start()] + m.group(1) + f" ({m.group(2)})" + markdown[m.end():])


def render_markdown(runs: pd.DataFrame, config: ReportConfig = ReportConfig()) -> str:
    """The comparison table and the verdict (the Answer's, as every view quotes it) as Markdown, for a
    README: every number from the run files."""
    a = Analysed.of(runs, config)
    return (comparison_markdown(a.comparison) + "\n\n" + a.answer.verdict() + "\n"
            + scaling_markdown(a.scaling))


HEALTH_RUNS = 4  # FP8 runs whose health heatmaps the page shows; the rest are named


def _health_section(health: dict) -> list[str]:
    """FP8 health: per FP8 run with statistics, the underflow and saturation heatmaps and its warnings."""
    e = html.escape
    out = ["<h2>FP8 health</h2>",
           f'<p class="muted">Every --fp8-stats-every steps, per layer and tensor kind: the fraction of values an FP8 '
           f"cast flushes to 0 (underflow) or clips at the format's max (saturation), the worst GEMM of each decoder "
           f"block shown. A warning names a layer past {fp8stats.SATURATION_WARN:.1%} saturation or "
           f"{fp8stats.UNDERFLOW_WARN:.0%} underflow for {fp8stats.WARN_SAMPLES} samples in a row "
           "(fp8lab.fp8.stats).</p>"]
    if not health:
        return out + ['<p class="muted">No FP8 statistics in these runs (FP8 runs record them unless '
                      '--fp8-stats-every 0).</p>']
    # only these runs' statistics are read (fp8lab.analysis.fp8_stats.StatsFiles)
    for run_id in list(health)[:HEALTH_RUNS]:
        recs = health[run_id]
        t = health_reader.table(recs)
        out.append(f"<h3>{e(run_id)}</h3>")
        out.append(f'<p class="muted">{e(health_reader.source_text(recs).capitalize())}.</p>')
        out.append(_img(plots.fp8_health_figure(t, "both", run_id),  # one figure a run: half the drawing
                        f"FP8 underflow and saturation per decoder block and step, {run_id}"))
        warns = health_reader.warnings_of(recs)
        out.append("<ul>" + "".join(f"<li>{e(w)}</li>" for w in warns) + "</ul>" if warns else
                   '<p class="muted">No early warning in this run.</p>')
    if len(health) > HEALTH_RUNS:
        out.append(f'<p class="muted">Also with statistics: {e(", ".join(list(health)[HEALTH_RUNS:]))}.</p>')
    return out


# what the loader reads in a folder of runs (fp8lab.analysis.load): a file of these is never written over
_READ_SUFFIXES = (".jsonl", ".csv", ".json")


def refuse_input(option: str, value: str | Path, sources: Iterable[str | Path]) -> None:
    """ValueError naming ``option`` when the file it writes is one of the run files it reads: a source
    itself, or a file the loader reads inside a source folder."""
    out = Path(value).resolve()
    for src in sources:
        src = Path(src).resolve()
        if out == src or (src.is_dir() and src in out.parents and out.name.endswith(_READ_SUFFIXES)):
            raise ValueError(f"{option}={str(value)!r} is one of the run files the report reads; fp8lab never writes "
                             f"over its inputs; allowed: a file outside them, e.g. report.html")


GENERATOR_META = '<meta name="generator" content="fp8lab report">'  # says the page is fp8lab's: a re-run may replace it
_PAGE_HEAD = '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>fp8lab'  # pages written before it


def _ours(head: str, markdown: bool) -> bool:
    """The first bytes of a file fp8lab report wrote: its page (``markdown``: its table)."""
    return (head.startswith("| " + " | ".join(MARKDOWN_COLUMNS.values()) + " |") if markdown
            else GENERATOR_META in head or head.startswith(_PAGE_HEAD))


def build_report(sources: object = None, out: str | Path = "report.html",
                 config: ReportConfig = ReportConfig(), runs: pd.DataFrame | None = None) -> Path:
    """Load ``sources`` (see :func:`fp8lab.analysis.load_runs`) and write the HTML page to ``out``; ``runs``:
    their table, if already read. For the committed results the summary comes from the results index, and only
    the result files of the runs the loss figures draw and of the FP8 health shown are read."""
    given = ([sources] if isinstance(sources, (str, Path, pd.DataFrame)) else list(sources) if sources is not None
             else [RESULTS_DIR])
    refuse_input("out", out, [s for s in given if isinstance(s, (str, Path))])
    with files_read_once():  # the runs' files, read for their steps and again for their FP8 statistics: opened once
        return _build_report(sources, Path(out), config, runs)


def _build_report(sources: object, out: Path, config: ReportConfig, runs: pd.DataFrame | None) -> Path:
    summary, health, analysed = None, None, None
    idx = committed_index() if is_committed_results(sources) else None
    if idx is not None:
        summary = committed_summary(config.warmup_steps, config.smoothing, config.smoothing_span)
        health = idx.health()
        if runs is None and summary is not None:  # the per-step curves the page draws: the loss studies' runs
            analysed = Analysed.of(None, config, summary=summary)
            runs = idx.runs_of(analysis.loss_run_ids(analysed.answer.rows))
    runs = analysis.load_runs(sources) if runs is None else runs
    out.parent.mkdir(parents=True, exist_ok=True)
    health = health_reader.of_sources(sources) if health is None else health
    ownership.write_file(out, render_html(runs, config, health=health, summary=summary, analysed=analysed))
    return out


def main(argv: Iterable[str] | None = None) -> int:
    d = ReportConfig()
    p = OneLineParser(prog="fp8lab report", description="Turn runs into one self-contained HTML report.")
    p.add_argument("runs", nargs="*", help="trainer output folders, result files or folders (default: data/results)")
    p.add_argument("--out", default="report.html", help="HTML file to write (default: report.html)")
    p.add_argument("--tokens", type=positive_float, default=d.tokens, help="token budget for time/cost (default: 24e9)")
    p.add_argument("--price-per-hour", "--price", dest="price", type=price_arg, default=None, metavar="USD|lookup",
                   help="USD per instance-hour, or 'lookup' (the AWS Price List API's on-demand price), as for "
                        f"fp8lab launch plan (default: {price_words(None, full=True)})")
    p.add_argument("--gpus-per-instance", type=positive_int, default=d.gpus_per_instance)
    p.add_argument("--warmup-steps", type=nonneg_int, default=d.warmup_steps)
    p.add_argument("--smoothing", choices=analysis.SMOOTHING_METHODS, default=d.smoothing)
    p.add_argument("--smoothing-span", type=positive_int, default=d.smoothing_span)
    p.add_argument("--markdown", metavar="FILE", help="also write the comparison table and verdict as Markdown")
    p.add_argument("--docs", action="store_true",
                   help=f"regenerate the README's results block, {RESULTS_MD} and {HEADLINE_PNG} in this checkout "
                        "from the runs (default: data/results), instead of the HTML page")
    p.add_argument("--docs-root", metavar="DIR", help="with --docs: the checkout to write into (default: this one)")
    args = p.parse_args(list(argv) if argv is not None else None)
    try:  # the price first (a lookup asks AWS): every cost stands beside it
        price = price_of(analysis.answer.ANSWER_INSTANCE, args.price)
    except ValueError as exc:
        print(f"fp8lab report: error: {exc}", file=sys.stderr)
        return 2
    config = ReportConfig(args.tokens, price, args.gpus_per_instance, args.warmup_steps, args.smoothing,
                          args.smoothing_span)
    try:  # where the page goes, before anything is read or written
        if args.markdown is not None and not args.docs and Path(args.out).resolve() == Path(args.markdown).resolve():
            raise ValueError(f"--out={args.out!r} and --markdown={args.markdown!r} name one file; the table would "
                             "replace the page; allowed: two file names, e.g. report.html and report.md")
        for option, value in (("--out", args.out), ("--markdown", args.markdown)):
            if value is not None and not args.docs:
                check_writable_file(option, value)
                refuse_input(option, value, args.runs or [RESULTS_DIR])
                refuse_replacing(option, value, lambda head, md=option == "--markdown": _ours(head, md),
                                 "a report fp8lab wrote")
    except ValueError as exc:
        print(f"fp8lab report: error: {exc}", file=sys.stderr)
        return 2
    if args.docs:
        try:
            written = write_docs(args.docs_root, sources=args.runs or None, config=config)
        except (ValueError, FileNotFoundError) as exc:
            print(f"fp8lab report: error: {exc}", file=sys.stderr)
            return 1
        print("wrote " + ", ".join(analysis.display_path(w) for w in written))
        return 0
    with files_read_once():  # the runs read here are read again for the page's FP8 statistics: opened once
        return _report_main(args, config)


def _report_main(args, config: ReportConfig) -> int:
    try:
        loaded = None
        for src in args.runs:  # a source given explicitly must hold runs (no-argument: the committed results)
            if len(args.runs) == 1 and is_committed_results(src) and committed_index() is not None \
                    and len(committed_index().summary):  # it does: build_report reads what the page draws
                break
            loaded = analysis.load_runs(src)
            if not len(loaded):
                raise ValueError(f"RUNS: {analysis.display_path(Path(src))!r} holds no runs (no metrics.jsonl with "
                                 "complete records, result .jsonl file or collect .csv); allowed: trainer output "
                                 "folders, result files, or folders holding them")
        # one source: the table just read is the report's (several: read together, run ids made unique across them)
        out = build_report(args.runs or None, args.out, config, runs=loaded if len(args.runs) == 1 else None)
        if args.markdown:
            ownership.write_file(args.markdown, render_markdown(analysis.load_runs(args.runs or None), config))
    except (ValueError, FileNotFoundError) as exc:
        print(f"fp8lab report: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a full disk, a file-size limit: the page's temporary file is gone, the old page whole
        print(f"fp8lab report: error: {exc.strerror or exc} ({Path(exc.filename).name if exc.filename else args.out}); "
              "nothing half-written is left and a page written before stays as it was", file=sys.stderr)
        return 1
    print(f"wrote {out}" + (f" and {args.markdown}" if args.markdown else ""))
    return 0


# --------------------------------------------------------------------------- README and docs
# `fp8lab report --docs` regenerates, from data/results/ alone: the README's results block (the
# headline table, at most one row per model and GPU), docs/results.md (every table, the verdict and
# the study notes) and docs/headline.png. tests/integration/test_docs.py fails when a committed copy is stale.

DOCS_COMMAND = "fp8lab report --docs"
README_BEGIN = "<!-- results: generated by `fp8lab report --docs` from data/results/; do not edit by hand -->"
README_END = "<!-- results: end -->"
HEADLINE_PNG = "docs/headline.png"
RESULTS_MD = "docs/results.md"
HEADLINE_DPI = 110


def _tps(v: float) -> str:
    return "-" if pd.isna(v) else f"{v:,.0f}"


def _pct(v: float) -> str:
    return "-" if pd.isna(v) else f"{100 * v:.1f}%"


def headline_markdown(headline: pd.DataFrame, tokens: float = analysis.DEFAULT_TOKEN_BUDGET,
                      price: object = None) -> str:
    """The headline table (tokens/s/GPU on one GPU unless the row says otherwise; an
    :class:`fp8lab.analysis.Answer`'s rows, with the planned time and cost of ``tokens`` at ``price``, named with its
    date in the column's header) and, below it, the configuration and run behind each number."""
    budget = f"{analysis.fmt_tokens(tokens)} tokens on one P5 at {price_words(price)}: BF16 -> FP8"
    lines = ["| model | plain transformers BF16 | best BF16 | best FP8 | FP8 speedup | BF16 MFU | FP8 MFU | FP8 loss "
             f"gap | {budget} | source reported |", "|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    several_gpus = headline["gpu_name"].nunique() > 1  # then each row names its GPU (one table, never a mixed row)
    for _, r in headline.iterrows():
        gap = "-" if pd.isna(r["loss_gap_pct"]) else f"{r['loss_gap_pct']:+.2f}%"
        src = ("-" if pd.isna(r["source_speedup"])
               else f"{r['source_speedup']:.2f}x, ~{r['source_loss_gap_pct']:+g}% loss")
        speed = "-" if pd.isna(r["speedup"]) else f"**{r['speedup']:.2f}x**"
        gpus = "" if r["world_size"] == 1 else f" ({int(r['world_size'])} GPUs)"
        if several_gpus:
            gpus += f" on {gpu_label(r['gpu_name'])}"
        cost = ("-" if pd.isna(r["cost_fp8"]) else
                f"{r['hours_bf16']:,.1f} h ${r['cost_bf16']:,.0f} -> {r['hours_fp8']:,.1f} h ${r['cost_fp8']:,.0f}"
                + (f" ({r['cost_note']})" if isinstance(r.get("cost_note"), str) and r["cost_note"] else ""))
        lines.append(f"| {r['model']}{gpus} | {_tps(r['tps_hf'])} | {_tps(r['tps_bf16'])} | {_tps(r['tps_fp8'])} | "
                     f"{speed} | {_pct(r['mfu_bf16'])} | {_pct(r['mfu_fp8'])} | {gap} | {cost} | {src} |")
        parts = [f"best BF16 `{r['bf16_variant']}` {r['bf16_layout']}",
                 f"best FP8 `{r['fp8_variant']}` {r['fp8_layout']}"]
        if isinstance(r["hf_run"], str):
            parts.insert(0, f"plain `{r['hf_variant']}` {r['hf_layout']}")
        if isinstance(r["loss_study"], str):
            vs = (analysis.parity.seeds_label(r["loss_bf16_seeds"], r["loss_bf16_spread_pct"])
                  if r.get("loss_bf16_seeds", 1) > 1 else "BF16")
            fp8 = analysis.parity.fp8_label(r['loss_fp8_variant'], r.get('loss_fp8_seeds'))
            parts.append(f"loss: {r['loss_gap_kind']}, {fp8} against {vs} after "
                         f"{analysis.fmt_tokens(r['loss_tokens'])} tokens each (study `{r['loss_study']}`)")
        notes.append(f"- **{r['model']}** on {r['gpu_name']}: " + "; ".join(parts) + ".")
    if not len(headline):
        lines.append("| " + " | ".join(["-"] * 10) + " |")
    return "\n".join(lines) + "\n\n" + "\n\n".join(notes) + ("\n" if notes else "")  # a loose list: a block each


def _price_caveat(price: object) -> str:
    """Beside the assumed default price: that it is one, and how to price today's."""
    p = price_of(analysis.answer.ANSWER_INSTANCE, price)
    return "" if p.given or not p.source.startswith("assumed") else (
        " (assumed; P5 prices were cut in 2025: `--price-per-hour N` or `--price-per-hour lookup` prices today's)")


def _readme_block(headline: pd.DataFrame, n_runs: int, gpus: str, tokens: float, same_loss: list[str] = (),
                  main: str | None = None, blog: str = "", peers: str | None = None, price: object = None) -> str:
    """README's results block: the figure, a caption of a few short bullets, the table (the runs and layouts behind
    each number: docs/results.md). ``same_loss``: the time-to-the-same-loss sentences (analysis.time_to_loss).
    ``main``: the one GPU whose rows the table shows (:func:`fp8lab.analysis.answer.main_gpu`); the others are
    counted under it."""
    others = headline[headline["gpu_name"] != main] if main else headline.iloc[:0]
    table = headline_markdown(headline.drop(others.index), tokens, price).split("\n\n")[0]
    elsewhere = "" if not len(others) else (
        f" The table's rows are on {main}; {len(others)} more on "
        f"{', '.join(sorted(map(str, others['gpu_name'].unique())))} ({', '.join(others['model'])}): "
        f"[`{RESULTS_MD}`]({RESULTS_MD}).")
    loss = ("; ".join(same_loss) + ".") if same_loss else "no loss study with a BF16 and an FP8 run yet."
    bullets = [
        f"- **Speed**: tokens/s/GPU of {n_runs} measured runs on {gpus}, one GPU unless a row says otherwise: each "
        "model's plain `transformers` BF16 run and the fastest BF16 and FP8 runs fp8lab measured; MFU over the dense "
        f"BF16 peak for both.{elsewhere}",
        "- **Loss**: FP8's validation-loss gap in the loss study (the same tokens; a mean where several seeds ran).",
        f"- **Time to the same loss**: {loss}",
        *([f"- **Beside the peers**: {peers}."] if peers else []),
        f"- **Cost**: {analysis.fmt_tokens(tokens)} tokens on one ml.p5.48xlarge at "
        f"{price_words(price)}{_price_caveat(price)}, "
        "as `fp8lab launch plan` estimates them from the table's one-H100 runs, projected to its 8 H100s (8-GPU "
        f"efficiency). **Source**: reported on H100 P5, not measured here: {analysis.source_link()}.",
        *([f"- **Why faster than the blog**: {blog}"] if blog else []),
    ]
    return "\n".join([
        README_BEGIN,
        f"![FP8 against BF16 per model]({HEADLINE_PNG})",
        "",
        "\n\n".join(bullets),  # a loose list: each bullet a block of its own in the source too
        "",
        table,
        "",
        f"Runs, layouts, the verdict, scaling and the notes per study: [`{RESULTS_MD}`]({RESULTS_MD}).",
        README_END,
    ])


def _study_notes(summary: pd.DataFrame, results_dir: Path) -> str:
    """Each study's ``ABOUT.md`` (prose written by whoever measured it, no numbers) under its run count."""
    out = []
    for study in sorted(summary["study"].dropna().unique()):
        n = int((summary["study"] == study).sum())
        about = results_dir / str(study) / "ABOUT.md"
        text = about.read_text(encoding="utf-8").strip() if about.exists() else "(no notes for this study)"
        out.append(f"### `{study}` ({n} runs)\n\n{text}\n")
    return "\n".join(out)


@dataclass(frozen=True)
class Analysed:
    """What the docs show, computed once from the runs: per-run summary, BF16/FP8 pairs, headline."""

    reference: pd.DataFrame
    summary: pd.DataFrame
    comparison: pd.DataFrame
    answer: analysis.Answer

    @property
    def headline(self) -> pd.DataFrame:
        return self.answer.rows

    @functools.cached_property
    def scaling(self) -> pd.DataFrame:
        """The per-GPU scaling table of the summary (the page's figure and its table read it)."""
        return analysis.scaling_table(self.summary)

    @classmethod
    def of(cls, runs: pd.DataFrame, config: "ReportConfig", reference: pd.DataFrame | None = None,
           summary: pd.DataFrame | None = None) -> "Analysed":
        """``summary``: the runs' per-run summary at ``config``'s settings, if already made."""
        reference = analysis.load_reference() if reference is None else reference
        if summary is None:
            summary = analysis.summarize_runs(runs, config.warmup_steps, config.smoothing, config.smoothing_span)
        comparison = analysis.compare_precisions(summary)
        answer = analysis.Answer.of(summary, comparison, reference, config.tokens, config.price_per_instance_hour)
        return cls(reference, summary, comparison, answer)


def render_results_doc(runs: pd.DataFrame, config: ReportConfig = ReportConfig(),
                       results_dir: Path | None = None, analysed: Analysed | None = None) -> str:
    """docs/results.md: the headline, the verdict, every BF16/FP8 pair, scaling, every run, the study
    notes and the caveats; all numbers from ``runs`` (``analysed``: their analysis, if already made)."""
    a = analysed or Analysed.of(runs, config)
    summary, comparison, headline = a.summary, a.comparison, a.headline
    text = "\n\n".join(_verdict(runs, a))  # a loose list: each bullet a block of its own in the source too
    return "\n".join([
        "# fp8lab: measured results",
        "",
        f"Generated by `{DOCS_COMMAND}` from the {summary['run_id'].nunique()} result files in `data/results/` "
        "(format and provenance: `data/results/README.md`); do not edit by hand.",
        "",
        "## Headline",
        "",
        "![FP8 against BF16 per model](headline.png)",
        "",
        headline_markdown(headline, config.tokens, a.answer.price),
        "## Verdict",
        "",
        text,
        "",
        "## Why faster than the blog",
        "",
        "llama-7b on one GPU, one change at a time from a plain script's layout to the resolver's "
        "(notebook 05 draws it):",
        "",
        blog_gap.markdown(blog_gap.blog_gap_table(summary, a.reference)),
        "## Caveats",
        "",
        CAVEATS,
        "",
        "## Every BF16/FP8 pair",
        "",
        "Each FP8 run against the fastest BF16 run of the same model, GPU, scale, study and batch layout "
        "(micro-batch x sequence, accumulation steps).",
        "",
        comparison_markdown(comparison),
        peers_markdown(summary),
        scaling_markdown(a.scaling),
        "## Every run",
        "",
        runs_markdown(summary),
        "## Studies",
        "",
        _study_notes(summary, Path(results_dir) if results_dir else RESULTS_DIR),
    ]).rstrip("\n") + "\n"


def render_docs(sources: object = None, config: ReportConfig = ReportConfig(), readme: str | None = None) -> dict:
    """{'README.md': the README with its results block regenerated (``readme``: its current text),
    'docs/results.md': text, 'docs/headline.png': the figure}, from ``sources`` (default: data/results/); for the
    committed results also 'data/results-index.json', the index planning reads (:mod:`fp8lab.analysis.index`), and
    'fp8lab/plan/evidence.json', the committed GPU checks' values the plan's ``auto`` rules follow."""
    with Counter("fp8lab report: the docs", "part", total=5) as bar:
        runs = analysis.load_runs(sources)
        a = Analysed.of(runs, config)
        bar.tick()
        summary, headline = a.summary, a.headline
        out = {RESULTS_MD: render_results_doc(runs, config, analysed=a)}
        bar.tick()
        out[HEADLINE_PNG] = plots.headline_figure(analysis.answer.on_main_gpu(analysis.best_runs(summary), headline),
                                                  a.reference)
        bar.tick()
        if is_committed_results(sources):  # the index of the committed runs (fp8lab.analysis.index), one read
            out[evidence.DOC] = evidence.render(RESULTS_DIR)  # the values the plan's auto rules follow (package data)
            settings = {"warmup_steps": config.warmup_steps, "smoothing": config.smoothing,
                        "smoothing_span": config.smoothing_span}  # the summary too, where made at the index's settings
            out[INDEX_DOC] = render_index(runs=runs, summary=summary if settings == SUMMARY_DEFAULTS else None)
        bar.tick()
        if readme is not None:
            out["README.md"] = _readme(readme, runs, a, config)
        bar.tick()
    return out


def _readme(readme: str, runs, a: "Analysed", config: ReportConfig) -> str:
    """The README with its results block regenerated (``readme``: its current text)."""
    summary, headline = a.summary, a.headline
    main = analysis.answer.main_gpu(headline)  # the README's table: one row per model, on P5's GPU
    if README_BEGIN not in readme or README_END not in readme:
        raise ValueError("README.md: the results block markers are missing; add the two lines\n"
                         f"{README_BEGIN}\n{README_END}")
    gpus = ", ".join(sorted(map(str, summary["gpu_name"].dropna().unique()))) or "no GPU"
    head, rest = readme.split(README_BEGIN, 1)
    tail = rest.split(README_END, 1)[1]

    loss_runs, _ = analysis.headline_runs(runs, summary, headline)
    same = [f"{r['model']}: {sentence(r)}" for _, r in time_to_loss(a.answer, loss_runs).iterrows()]
    blog = blog_gap.sentence(blog_gap.blog_gap_table(summary, a.reference))
    return head + _readme_block(headline, int(summary["run_id"].nunique()), gpus, config.tokens, same, main,
                                blog, peers_sentence(summary, RESULTS_MD), a.answer.price) + tail


def write_docs(root: str | Path | None = None, sources: object = None,
               config: ReportConfig = ReportConfig()) -> list[Path]:
    """Write what :func:`render_docs` makes into the repository at ``root`` (default: this checkout)."""
    root = Path(root) if root else REPO_ROOT
    readme = root / "README.md"
    docs = render_docs(sources, config, readme.read_text(encoding="utf-8") if readme.exists() else None)
    written = []
    for rel, content in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".png"):
            content.savefig(path, format="png", dpi=HEADLINE_DPI, bbox_inches="tight", metadata={"Software": None})
        else:
            path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # at the end: main() reads the docs section's names
    raise SystemExit(main())
