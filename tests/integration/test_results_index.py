"""The results index (issue 47, ``fp8lab.analysis.index``): data/results-index.json holds what planning and
the answer need from the committed runs, so they read one small file instead of every result file.
The committed copy must equal what `fp8lab report --docs` makes now; it must give exactly the frames
reading the files gives; a plan reads no result file while it is fresh; a stale or foreign one is not
used; a user's own runs never go through it."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from fp8lab import analysis
from fp8lab.analysis import estimates, scaling
from fp8lab.analysis import index
from fp8lab.core.paths import RESULTS_DIR

_CACHE: dict = {}


def _read_from_files():
    if not _CACHE:  # every result file: once per test session
        runs = analysis.load_runs()
        _CACHE.update(runs=runs, summary=analysis.summarize_runs(runs), profiles=analysis.load_profiles())
    return _CACHE


def _clear_caches():
    index.committed_index.cache_clear()
    estimates._measurements.cache_clear()
    scaling._calibration.cache_clear()
    scaling._profiles_of.cache_clear()


def test_committed_index_is_current():
    got = index.render_index(runs=_read_from_files()["runs"])
    assert index.INDEX_PATH.read_text(encoding="utf-8") == got, \
        "data/results-index.json is stale: run `fp8lab report --docs` and commit the result"


def test_index_gives_the_frames_reading_the_files_gives():
    idx = index.committed_index()
    assert idx is not None, "the committed index does not match data/results/: run `fp8lab report --docs`"
    files = _read_from_files()
    for got, want in ((idx.summary, files["summary"]), (idx.profiles, files["profiles"])):
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        for col in want.columns[want.dtypes == object]:  # True is not 1, None is not NaN
            assert [type(v) for v in got[col]] == [type(v.item()) if hasattr(v, "item") else type(v)
                                                  for v in want[col]], col
    assert idx.description == analysis.describe(files["runs"])
    assert idx.files == len(index.indexed_files())


def test_a_plan_reads_no_result_file_while_the_index_is_fresh(monkeypatch):
    from fp8lab.analysis import load
    from fp8lab.launch import plan_sweep
    from fp8lab.launch.plan import format_cost_table

    _clear_caches()

    def refuse(*_a, **_k):
        raise AssertionError("a result file was read")

    for name in ("load_runs", "load_profiles", "_load_result_file"):
        monkeypatch.setattr(load, name, refuse)
    monkeypatch.setattr(estimates, "load_runs", refuse)
    from fp8lab.core.hardware import PLACEHOLDER_BUCKET, PLACEHOLDER_ROLE

    plan = plan_sweep(["llama-7b"], ["bf16", "fp8"], [1, 2], tokens=24 * 10**9, role=PLACEHOLDER_ROLE,
                      bucket=PLACEHOLDER_BUCKET)
    table = format_cost_table(plan)
    assert "7391.33" in table and "5251.65" in table  # the example, from the index alone
    _clear_caches()


def _small_results(tmp_path):
    root = tmp_path / "results"
    for rel in ("loss-1b/llama-1b-te-bf16-w30.jsonl", "loss-1b/llama-1b-te-fp8-delayed-w30.jsonl"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(RESULTS_DIR / rel, root / rel)
    return root


def test_a_stale_or_foreign_index_is_not_used(tmp_path, monkeypatch, capsys):
    root = _small_results(tmp_path)
    path = tmp_path / "results-index.json"
    monkeypatch.setattr(index, "RESULTS_DIR", root)
    monkeypatch.setattr(index, "INDEX_PATH", path)
    index.committed_index.cache_clear()
    assert index.committed_index() is None  # none written: callers read the files, nothing said
    assert capsys.readouterr().err == ""
    index.write_index(path, root)
    idx = index.committed_index()
    assert idx is not None and idx.files == 2 and len(idx.summary) == 2
    assert list(idx.summary["run_id"]) == list(analysis.summarize_runs(analysis.load_runs(root))["run_id"])
    # a run added without `fp8lab report --docs`: the index no longer describes the files
    shutil.copy(RESULTS_DIR / "loss-1b/llama-1b-te-fp8-current-w30.jsonl", root / "loss-1b" / "new.jsonl")
    index.committed_index.cache_clear()
    assert index.committed_index() is None
    err = capsys.readouterr().err
    assert "changed since" in err and "fp8lab report --docs" in err and err.count("\n") == 1
    # an edited file counts too, and so does a file of another format
    index.write_index(path, root)
    with (root / "loss-1b" / "new.jsonl").open("a") as f:
        f.write("\n")
    index.committed_index.cache_clear()
    assert index.committed_index() is None
    index.write_index(path, root)
    raw = json.loads(path.read_text())
    path.write_text(json.dumps({**raw, "format": 999}))
    index.committed_index.cache_clear()
    assert index.committed_index() is None and "another format" in capsys.readouterr().err
    index.committed_index.cache_clear()


def test_only_the_committed_results_go_through_the_index(tmp_path):
    assert index.is_committed_results(None)
    assert index.is_committed_results(RESULTS_DIR) and index.is_committed_results([str(RESULTS_DIR)])
    assert not index.is_committed_results(tmp_path)
    assert not index.is_committed_results([RESULTS_DIR, tmp_path])
    assert not index.is_committed_results(RESULTS_DIR / "loss-1b")
    assert not index.is_committed_results(pd.DataFrame({"step": [1]}))
    # other summary settings than the index's: read the files
    assert index.committed_summary(warmup_steps=5) is None


def test_cli_latency_doc_is_the_result_file():
    """docs/cli-latency.md's table is generated from the committed benchmark result (benchmarks/cli_latency.py)."""
    import importlib.util

    from fp8lab.core.paths import REPO_ROOT

    spec = importlib.util.spec_from_file_location("cli_latency", REPO_ROOT / "benchmarks" / "cli_latency.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = json.loads((REPO_ROOT / "data" / "cli-latency.json").read_text(encoding="utf-8"))
    assert set(result["commands"]) == set(bench.COMMANDS)  # every command of the list measured
    for name, row in result["commands"].items():
        assert len(row["seconds"]) == result["repeats"] >= 3 and row["median_s"] == round(
            sorted(row["seconds"])[len(row["seconds"]) // 2], 2), name
    doc = bench.DOC.read_text(encoding="utf-8")
    block = doc.split(bench.BEGIN, 1)[1].split(bench.END, 1)[0]
    assert block == "\n" + bench.render_markdown(result), \
        "docs/cli-latency.md is stale: python benchmarks/cli_latency.py --docs data/cli-latency.json"


def _count_opens(monkeypatch) -> dict:
    """path (resolved) -> times opened, for every file opened under data/results/ from here on."""
    import builtins
    import io
    from pathlib import Path

    opened: dict = {}
    real = io.open

    def counting(file, *a, **k):
        if isinstance(file, (str, Path)) and str(RESULTS_DIR.resolve()) in str(Path(file).resolve()):
            key = str(Path(file).resolve())
            opened[key] = opened.get(key, 0) + 1
        return real(file, *a, **k)

    monkeypatch.setattr(io, "open", counting)
    monkeypatch.setattr(builtins, "open", counting)
    return opened


def test_the_committed_report_reads_each_result_file_once_and_draws_the_same_page(tmp_path, monkeypatch):
    """Issue 47: `fp8lab report data/results` read every result file three times (the runs, the FP8 statistics, the
    index's digest). Now each is opened once (the digest's read is kept for the rest), only the loss studies' runs
    and the shown FP8 statistics are parsed, and the page is the one the full read gives."""
    import re

    from fp8lab.core import paths
    from fp8lab.analysis import fp8_stats as fp8stats
    from fp8lab.views import report

    _clear_caches()
    paths._RESULT_BYTES.clear()
    parsed = []
    real_load = analysis.load._load_result_file
    monkeypatch.setattr(analysis.load, "_load_result_file", lambda p: (parsed.append(p), real_load(p))[1])
    opened = _count_opens(monkeypatch)
    page = report.build_report(RESULTS_DIR, tmp_path / "r.html").read_text(encoding="utf-8")
    assert opened and max(opened.values()) == 1, {k: v for k, v in opened.items() if v > 1}
    n_files = len(index.indexed_files())
    assert 0 < len(parsed) < n_files / 4  # the loss studies' runs only (every file before)
    monkeypatch.undo()

    runs = _read_from_files()["runs"]  # the old way: every file, the statistics found by reading them all
    full = report.render_html(runs, health=fp8stats.of_sources(None))
    stamp = re.compile(r"Generated \d{4}-\d\d-\d\d \d\d:\d\d UTC")
    assert stamp.sub("", page) == stamp.sub("", full)
    idx = index.committed_index()
    assert list(idx.health()) == list(fp8stats.of_sources(None))  # the index names the runs with statistics


def test_summary_for_is_summarize_runs_and_the_index_only_serves_the_whole_committed_set(monkeypatch):
    """Notebook 05's summary (issue 47): the index's for the committed runs at its settings, else computed."""
    read = _read_from_files()
    runs, summary = read["runs"], read["summary"]
    _clear_caches()
    pd.testing.assert_frame_equal(analysis.summary_for(runs, None), summary)
    model = str(runs["model"].dropna().iloc[0])
    some = analysis.select_runs(runs, [model])
    calls = []
    real = analysis.summary.summarize_runs
    monkeypatch.setattr(index, "summarize_runs", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    pd.testing.assert_frame_equal(analysis.summary_for(some, None), real(some))  # a filter left runs out: computed
    assert calls == [1]
    assert analysis.summary_for(runs, None, warmup_steps=5).equals(real(runs, 5)) and calls == [1, 1]
    analysis.summary_for(runs, None)
    assert calls == [1, 1]  # the whole committed set at the index's settings: no summarizing
