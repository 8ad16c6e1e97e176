"""FP8 health's reader: the ``fp8_stats`` records of runs read back, as rows, words and warnings.

The records are written by fp8lab.fp8.stats (fp8lab's own hooks and quantizers) and fp8lab.fp8.te_debug (TE's debug
API), one ``{"record": "fp8_stats", "step": ...}`` line per sampled step in metrics.jsonl; the rule that decides when
and by whom is fp8lab.plan.fp8_stats. Notebook 03, the HTML report (fp8lab.views.report) and the results index
(fp8lab.analysis.index) read them here.
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Iterable

from fp8lab.core.paths import REPO_ROOT, RESULTS_DIR, read_result_text
from fp8lab.fp8.stats import RECORD, TE_DEBUG
from fp8lab.records import metrics as fmetrics


def records(recs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fp8_stats records among metrics.jsonl records."""
    return [r for r in recs if isinstance(r, dict) and r.get("record") == RECORD]


def block_of(layer: str) -> str:
    """A GEMM site's decoder block ('block 3'), from the first number in its name; else the name."""
    m = re.search(r"\.(\d+)\.", f".{layer}.")
    return f"block {int(m.group(1)):02d}" if m else layer


def table(recs: Iterable[dict[str, Any]]):
    """One row per (step, layer, kind) of the fp8_stats records, with the layer's block (a DataFrame)."""
    import pandas as pd

    rows = [{"step": r["step"], **row, "block": block_of(row["layer"])} for r in records(recs) for row in r["layers"]]
    cols = ["step", "layer", "kind", "format", "amax", "scale", "underflow", "saturation", "block"]
    return pd.DataFrame(rows, columns=cols)


def source_text(recs: Iterable[dict[str, Any]]) -> str:
    """Who read a run's casts, in words (records of ``--fp8-stats-source te-debug`` say so; older ones do not)."""
    if any(r.get("source") == TE_DEBUG for r in records(recs)):
        return ("read by Transformer Engine's debug API (nvdlfw-inspect): every GEMM, all micro-batches of each "
                "sampled step")
    return ("read by fp8lab (the emulator's quantizers, or hooks on TE's modules: the first micro-batch of each "
            "sampled step)")


def warnings_of(recs: Iterable[dict[str, Any]]) -> list[str]:
    return [w for r in records(recs) for w in r.get("warnings", [])]


def read(path) -> list[dict[str, Any]]:
    """The fp8_stats records of a trainer folder (its metrics.jsonl) or of a result file."""
    p = Path(path)
    p = p / "metrics.jsonl" if p.is_dir() else p
    return fmetrics.read_metrics(p, RECORD) if p.is_file() else []


def _stats_files(sources):
    """(name, file, its fp8_stats records) of each file with some, in the order :func:`of_sources` lists them;
    each file read once."""
    items = [RESULTS_DIR] if sources is None else [sources] if isinstance(sources, (str, Path)) else list(sources)
    for item in (Path(i) for i in items if isinstance(i, (str, Path))):  # a collect table holds no statistics
        files = [item / "metrics.jsonl"] if (item / "metrics.jsonl").is_file() else (
            sorted(item.rglob("*.jsonl")) if item.is_dir() else [item])
        for f in files:
            if not f.is_file():
                continue
            text = read_result_text(f)
            recs = fmetrics.metrics_in(text, RECORD)
            if not recs:
                continue
            if f.name == "metrics.jsonl":
                yield f.parent.name, f, recs
            else:
                first = json.loads(text.split("\n", 1)[0])
                yield first.get("run_id") or f.stem, f, recs


def of_sources(sources) -> dict[str, list[dict[str, Any]]]:
    """run_id -> fp8_stats records, from what ``fp8lab.analysis.load_runs`` reads (trainer folders, result
    files, folders holding them; None: data/results), named as it names the runs."""
    out: dict[str, list[dict[str, Any]]] = {}
    for name, _, recs in _stats_files(sources):
        out[name] = recs
    return out


def files_of_sources(sources) -> dict[str, Any]:
    """run name -> the file holding its fp8_stats records: :func:`of_sources`'s names and order (a results index
    keeps it, so that a view reads only the statistics it shows)."""
    out: dict[str, Any] = {}
    for name, path, _ in _stats_files(sources):
        out[name] = path
    return out


class StatsFiles(Mapping):
    """run name -> fp8_stats records, as :func:`of_sources` gives them, from a known name -> file map
    (:func:`files_of_sources`): a file is read when its records are first asked for, once."""

    def __init__(self, files: dict[str, Any]):
        self.files = dict(files)
        self._read: dict[str, list[dict[str, Any]]] = {}

    def __getitem__(self, name: str) -> list[dict[str, Any]]:
        if name not in self._read:
            self._read[name] = read(self.files[name])
        return self._read[name]

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def of_runs(runs) -> dict[str, list[dict[str, Any]]]:
    """run_id -> its fp8_stats records, for the runs of a ``fp8lab.analysis.load_runs`` table that have
    some (found through each run's ``source``, a path relative to the repository or the working folder)."""
    out: dict[str, list[dict[str, Any]]] = {}
    if not len(runs) or "source" not in runs:
        return out
    for run_id, source in runs[["run_id", "source"]].drop_duplicates().itertuples(index=False):
        if not isinstance(source, str):
            continue
        path = next((b / source for b in (REPO_ROOT, Path.cwd()) if (b / source).exists()), None)
        recs = read(path) if path is not None else []
        if recs:
            out[run_id] = recs
    return out
