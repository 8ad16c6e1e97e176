"""The index of the committed measurements: ``data/results-index.json``, one small file beside
``data/results/``, so that planning and the answer read the results once, not every step of every run.

It holds what ``fp8lab launch plan``, the estimates (:mod:`fp8lab.analysis.estimates`), the scaling model's
calibration (:func:`fp8lab.analysis.scaling.committed_calibration`), the :class:`~fp8lab.analysis.Answer`,
notebooks 04/05 and the report need from the committed runs: the per-run summary
(:func:`summarize_runs` at its defaults), the step profiles (:func:`load_profiles`) and the line saying
what was loaded (:func:`describe`). ``fp8lab report --docs`` writes it (:func:`render_index`) from the
result files; ``tests/integration/test_results_index.py`` fails when the committed copy is stale.

Reading it is checked, never trusted blindly: the index records a digest of the result and profile
files it was made from (their paths and bytes); where the files in ``data/results/`` differ (a run
added, a file edited), :func:`committed_index` answers None after one line on stderr, and callers read
the result files as before. A user's own runs (a folder, a CSV) never go through the index.
"""
from __future__ import annotations

import functools
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from fp8lab.analysis.load import describe, display_path, load_profiles, load_runs
from fp8lab.analysis.summary import summarize_runs
from fp8lab.core.paths import DATA_DIR, REPO_ROOT, RESULTS_DIR, read_result_bytes
from fp8lab.analysis import fp8_stats as fp8stats

INDEX_PATH = DATA_DIR / "results-index.json"
INDEX_DOC = "data/results-index.json"  # where `fp8lab report --docs` writes it, in the checkout it writes into
INDEX_FORMAT = 1
INDEX_COMMAND = "fp8lab report --docs"
# summarize_runs' defaults: the index's summary is valid for these only (other settings read the files)
SUMMARY_DEFAULTS = {"warmup_steps": 10, "smoothing": "ema", "smoothing_span": 20}


def indexed_files(root: Path = RESULTS_DIR) -> list[Path]:
    """The files the index is made from: result files (``*.jsonl``) and profiles (``*profile.json``) under
    ``root``, hidden folders left out (as :func:`load_runs` and :func:`load_profiles` search)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(f for f in root.rglob("*") if (f.name.endswith(".jsonl") or f.name.endswith("profile.json"))
                  and f.is_file() and not any(p.startswith(".") for p in f.relative_to(root).parts))


def files_digest(root: Path = RESULTS_DIR) -> str:
    """SHA-256 over each indexed file's path (relative to ``root``) and bytes: what the index rests on."""
    h = hashlib.sha256()
    for f in indexed_files(root):
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(read_result_bytes(f))  # kept: the runs read next need not open the file again
        h.update(b"\0")
    return h.hexdigest()


# --- frames as JSON, exactly: NaN stays NaN, None stays None, each column's dtype is restored -------
def _cell(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    return v


def _frame_json(df: pd.DataFrame) -> dict:
    return {"columns": [str(c) for c in df.columns], "dtypes": [str(t) for t in df.dtypes],
            "rows": [[_cell(v) for v in row] for row in df.itertuples(index=False, name=None)]}


def _frame(obj: dict) -> pd.DataFrame:
    cols, dtypes, rows = obj["columns"], obj["dtypes"], obj["rows"]
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    return pd.DataFrame({c: pd.Series(data[c], dtype=t) for c, t in zip(cols, dtypes)}, columns=cols)


def build_index(root: Path = RESULTS_DIR, runs: pd.DataFrame | None = None,
                summary: pd.DataFrame | None = None) -> dict:
    """The index of the runs under ``root`` (``runs``: ``load_runs(root)`` if already read; else read here;
    ``summary``: their ``summarize_runs`` at :data:`SUMMARY_DEFAULTS`, if already made)."""
    digest = files_digest(root)
    runs = load_runs(root) if runs is None else runs
    summary = summarize_runs(runs, **SUMMARY_DEFAULTS) if summary is None else summary
    profiles = load_profiles(root)
    return {"format": INDEX_FORMAT, "made_by": INDEX_COMMAND, "results": display_path(Path(root)),
            "digest": digest, "files": len(indexed_files(root)), "summary_settings": SUMMARY_DEFAULTS,
            "describe": describe(runs), "summary": _frame_json(summary), "profiles": _frame_json(profiles),
            "fp8_stats": [[name, display_path(path)] for name, path in fp8stats.files_of_sources(root).items()]}


def render_index(root: Path = RESULTS_DIR, runs: pd.DataFrame | None = None,
                 summary: pd.DataFrame | None = None) -> str:
    """The index file's text (deterministic: the same files give the same text)."""
    return json.dumps(build_index(root, runs, summary), allow_nan=True, separators=(",", ":")) + "\n"


def write_index(path: Path = INDEX_PATH, root: Path = RESULTS_DIR) -> Path:
    path = Path(path)
    path.write_text(render_index(root), encoding="utf-8")
    committed_index.cache_clear()
    return path


@dataclass(frozen=True)
class ResultsIndex:
    """The committed measurements as :func:`summarize_runs` (defaults) and :func:`load_profiles` give them."""

    summary: pd.DataFrame
    profiles: pd.DataFrame
    description: str
    files: int
    fp8_stats: tuple[tuple[str, str], ...] | None = None  # (name, result file) of the runs with FP8 statistics

    def health(self) -> "fp8stats.StatsFiles | None":
        """run name -> FP8 statistics of the committed runs that have some, as
        :func:`fp8lab.analysis.fp8_stats.of_sources` gives them for data/results/, each file read only when its records
        are asked for (None: an index written before it listed them)."""
        if self.fp8_stats is None:
            return None
        return fp8stats.StatsFiles({name: REPO_ROOT / source for name, source in self.fp8_stats})

    def runs_of(self, run_ids) -> pd.DataFrame:
        """The tidy table (:func:`load_runs`) of these committed runs only: their result files read, nothing else,
        each run named as in the summary (reading all of data/results/ names clashing ids by their file)."""
        wanted = self.summary[self.summary["run_id"].isin(set(run_ids))]
        by_source = dict(zip(wanted["source"], wanted["run_id"]))
        if not by_source:
            return load_runs([])
        runs = load_runs([REPO_ROOT / src for src in sorted(by_source)])
        runs["run_id"] = runs["source"].map(by_source)
        return runs

    def profiles_beside(self, result_files: list[str]) -> pd.DataFrame:
        """What ``load_profiles`` gives for the profiles beside ``result_files`` (full paths of committed
        ``.jsonl`` files, in that order): each file's ``<run>.profile.json`` that exists."""
        wanted = [display_path(Path(str(Path(s).with_suffix("")) + ".profile.json")) for s in result_files]
        parts = [self.profiles[self.profiles["source"] == w] for w in dict.fromkeys(wanted)]
        parts = [p for p in parts if len(p)]
        if not parts:
            return self.profiles.iloc[0:0].reset_index(drop=True)
        return pd.concat(parts, ignore_index=True)


def _say(line: str) -> None:
    print(f"fp8lab: {line}", file=sys.stderr)


@functools.lru_cache(maxsize=1)
def committed_index() -> ResultsIndex | None:
    """The committed index, where it matches the files in ``data/results/``; else None (after one line on
    stderr saying why and how to refresh it), and callers read the result files themselves."""
    if not INDEX_PATH.exists():
        return None

    try:  # a regular file only: opening a FIFO would wait for a writer that never comes
        raw = json.loads(INDEX_PATH.read_text(encoding="utf-8")) if INDEX_PATH.is_file() else None
        ok = isinstance(raw, dict) and raw.get("format") == INDEX_FORMAT
    except (OSError, ValueError):
        ok = False
    if not ok:
        _say(f"{display_path(INDEX_PATH)} is unreadable or of another format; reading the result files "
             f"(`{INDEX_COMMAND}` rewrites it)")
        return None
    if raw.get("results") != display_path(RESULTS_DIR) or raw.get("digest") != files_digest(RESULTS_DIR):
        _say(f"the files in {display_path(RESULTS_DIR)}/ changed since {display_path(INDEX_PATH)} was written; "
             f"reading the result files (`{INDEX_COMMAND}` refreshes it)")
        return None
    stats = raw.get("fp8_stats")
    return ResultsIndex(_frame(raw["summary"]), _frame(raw["profiles"]), str(raw["describe"]), int(raw["files"]),
                        None if stats is None else tuple((str(n), str(f)) for n, f in stats))


def committed_summary(warmup_steps: int = 10, smoothing: str = "ema", smoothing_span: int = 20) -> pd.DataFrame | None:
    """The committed runs' per-run summary from the index, where it is fresh and these are its settings."""
    settings = {"warmup_steps": warmup_steps, "smoothing": smoothing, "smoothing_span": smoothing_span}
    if settings != SUMMARY_DEFAULTS:
        return None
    idx = committed_index()
    return None if idx is None else idx.summary.copy()


def is_committed_results(sources: object) -> bool:
    """True for the sources that mean the committed results: None, or the ``data/results`` folder itself."""
    if sources is None:
        return True
    if isinstance(sources, (list, tuple)) and len(sources) == 1:
        sources = sources[0]
    if isinstance(sources, (str, Path)):
        try:
            return Path(sources).resolve() == RESULTS_DIR.resolve()
        except OSError:
            return False
    return False


def summary_for(runs: pd.DataFrame, sources: object = None, warmup_steps: int = 10, smoothing: str = "ema",
                smoothing_span: int = 20) -> pd.DataFrame:
    """``summarize_runs(runs, warmup_steps, smoothing, smoothing_span)`` for a table ``load_runs(sources)`` read: from
    the index where ``sources`` are the committed results, every committed run is in ``runs`` (no filter left one
    out) and these are the index's settings; else summarized here."""
    if is_committed_results(sources):
        summary = committed_summary(warmup_steps, smoothing, smoothing_span)
        if summary is not None and set(runs["run_id"].dropna().astype(str)) == set(summary["run_id"].astype(str)):
            return summary
    return summarize_runs(runs, warmup_steps, smoothing, smoothing_span)
