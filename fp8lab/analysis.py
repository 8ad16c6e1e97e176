"""Turn training and benchmark runs into the answer: does FP8 pay off, by how much, at what loss?

Three kinds of run sources load into one tidy table (a row per step, with the run's metadata):
trainer output folders (``metrics.jsonl`` + ``config.json``), a ``fp8lab.launch.collect`` table,
and result files under ``data/results/`` (format: ``data/results/README.md``). From that table:
per-run summaries (steady-state throughput, MFU, memory, loss), BF16-vs-FP8 comparisons per model
and scale, time and cost to train a token budget, and a verdict written from those numbers.

Figures live in :mod:`fp8lab.plots`; the HTML report in :mod:`fp8lab.report`.
"""
from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from fp8lab.hardware import DEFAULT_PRICES_USD_PER_HOUR
from fp8lab.paths import DATA_DIR, REPO_ROOT, RESULTS_DIR

# Run metadata carried on every row of the tidy table.
META_COLUMNS = [
    "run_id", "study", "source", "model", "precision", "backend", "recipe", "fuse", "variant",
    "gpu_name", "world_size", "instances", "micro_batch_size", "grad_accum", "seq_len",
    "parallel",  # ddp | fsdp on several GPUs: runs pair only within one mode
    "param_dtype",  # fp32 (default) or bf16 parameters with fp32 master weights
    "loss_comparable",  # False for throughput runs: too short for their loss to mean anything
    "recipe_spec", "bf16_edge_blocks",  # loss remedies: recipe settings (kind:key=value,...), blocks kept out of FP8
    "activation_checkpointing", "fsdp_keep_weights", "compile",
] + [  # provenance: what software ran, when, by which command
    "date", "command", "torch", "transformers", "transformer_engine", "torchao", "cuda", "driver",
]
PROVENANCE_COLUMNS = META_COLUMNS[META_COLUMNS.index("date"):]
# Per-step metrics (the trainer's metrics.jsonl keys).
METRIC_COLUMNS = [
    "step", "tokens", "loss", "val_loss", "lr", "grad_norm", "step_time_s", "tokens_per_sec",
    "tokens_per_sec_per_gpu", "mfu", "max_mem_gib",
]
COLUMNS = META_COLUMNS + ["record"] + METRIC_COLUMNS
RECORD_TYPES = ("run", "step", "summary")
SMOOTHING_METHODS = ("ema", "window", "none")
# The scale a BF16/FP8 pair must share to be compared: same model on the same hardware and size.
SCALE_KEYS = ("model", "gpu_name", "instances", "world_size", "parallel")
# ... and, by default, the same study and batch layout: runs measured together, on equal shapes
# (a BF16 run with 8 accumulation steps against an FP8 run with 1 would flatter or hurt FP8)
LAYOUT_KEYS = ("study", "micro_batch_size", "grad_accum", "seq_len")

# Other spellings of the metadata keys, as trainers, launchers and benchmarks write them.
_ALIASES = {
    "run_id": ("run_id", "run_name", "name", "job_name", "job"),
    "world_size": ("world_size", "num_gpus", "gpus"),
    "instances": ("instances", "instance_count", "num_nodes", "nnodes", "nodes"),
    "micro_batch_size": ("micro_batch_size", "batch_size", "per_device_batch_size", "micro_batch"),
    "grad_accum": ("grad_accum", "gradient_accumulation_steps", "grad_accum_steps"),
    "seq_len": ("seq_len", "seq_length", "max_seq_len", "block_size", "sequence_length"),
}

# Price used for time-and-cost estimates unless one is passed: the launcher's assumption, held in
# fp8lab.hardware (one place for it): the SageMaker AI on-demand training price of one
# ml.p5.48xlarge (8x H100) in us-east-1, USD per instance-hour, as listed around the source blog's
# date (2024-11). Not a quote: prices differ by region and changed since (AWS cut P5 prices in
# 2025). Pass your own.
DEFAULT_PRICE_PER_INSTANCE_HOUR = DEFAULT_PRICES_USD_PER_HOUR["ml.p5.48xlarge"]
PRICE_SOURCE = ("assumed SageMaker on-demand training price of ml.p5.48xlarge in us-east-1 as of 2024-11 "
                "(the value fp8lab.launch uses); pass your own price")
DEFAULT_TOKEN_BUDGET = 24e9  # the source's epoch: 24 billion tokens
DEFAULT_GPUS_PER_INSTANCE = 8  # P5: 8 GPUs per instance


class RunFileError(ValueError):
    """A run file cannot be read; the message names the file and the line."""


class RunFileWarning(UserWarning):
    """A run file was read only in part (e.g. a run still in progress)."""


# ----------------------------------------------------------------------------------- loading

def load_runs(sources: object = None) -> pd.DataFrame:
    """Read runs into one table: a row per step (or per summary record) with the run's metadata.

    ``sources``: a path or a DataFrame, or a list of them. A path may be a trainer output folder
    (``metrics.jsonl`` + optional ``config.json``), a result file (``*.jsonl`` whose first line is a
    ``{"record": "run"}``), a bare ``metrics.jsonl``, or a folder searched recursively for both.
    A DataFrame (or a ``.csv`` file, as ``fp8lab launch collect --csv`` writes) is a
    ``fp8lab.launch.collect`` table (metrics columns plus ``job``/``job_name`` and ``instance_count``). ``None`` reads the committed results in ``data/results/``.
    Column ``record`` is ``"step"`` for per-step rows and ``"summary"`` for a benchmark's summary.
    """
    if sources is None:
        sources = [RESULTS_DIR] if RESULTS_DIR.exists() else []
    if isinstance(sources, (str, Path, pd.DataFrame)):
        sources = [sources]
    frames = []
    for src in sources:
        if isinstance(src, pd.DataFrame):
            frames.append(_from_collect_table(src))
            continue
        if not isinstance(src, (str, Path)):
            raise ValueError(f"sources: expected paths or DataFrames, got {type(src).__name__}")
        frames.extend(_load_path(Path(src)))
    frames = [f for f in frames if len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype="object" if c in META_COLUMNS + ["record"] else "float64") for c in COLUMNS})
    df = pd.concat(frames, ignore_index=True, sort=False)
    df["run_id"] = _unique_run_ids(df)
    for c in COLUMNS:
        if c not in df:
            df[c] = np.nan
    extra = [c for c in df.columns if c not in COLUMNS]
    return df[COLUMNS + extra].reset_index(drop=True)


def _load_path(path: Path) -> list[pd.DataFrame]:
    if not path.exists():
        raise FileNotFoundError(f"run source {str(path)!r} does not exist")
    if path.is_file():
        if path.name == "metrics.jsonl":
            return [_load_trainer_dir(path.parent)]
        if path.suffix == ".csv":  # `fp8lab launch collect --csv FILE`
            try:
                return [_from_collect_table(pd.read_csv(path))]
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
        if path.suffix != ".jsonl":
            raise ValueError(f"run source {str(path)!r}: expected a .jsonl or .csv file, or a folder")
        return [_load_result_file(path)]
    if (path / "metrics.jsonl").exists():
        return [_load_trainer_dir(path)]
    files = [f for f in sorted(path.rglob("*.jsonl"))
             if not any(part.startswith(".") for part in f.relative_to(path).parts)]
    trainer_dirs = {f.parent for f in files if f.name == "metrics.jsonl"}
    frames = [_load_trainer_dir(d) for d in sorted(trainer_dirs)]
    # any other .jsonl is a result file, unless it lives inside a trainer output folder
    frames += [_load_result_file(f) for f in files
               if f.name != "metrics.jsonl" and not trainer_dirs.intersection(f.parents)]
    return frames


def load_profiles(sources: object = None) -> pd.DataFrame:
    """Profiles of training steps (``--profile-steps``): a row per run and kernel category.

    ``sources``: paths (or a list), as for :func:`load_runs`; a folder is searched for the harness's
    ``<run>.profile.json`` side files and for trainer output folders' ``profile.json``. ``None``: the
    committed results. Columns: run_id, model, variant (as :func:`variant_label` writes it), layout,
    category, ms (kernel time per step), total_ms, step_ms (unprofiled step), gpu_busy, note.
    """
    cols = ["run_id", "model", "variant", "precision", "layout", "category", "ms", "total_ms", "step_ms", "gpu_busy",
            "source", "note"]
    if sources is None:
        sources = [RESULTS_DIR] if RESULTS_DIR.exists() else []
    if isinstance(sources, (str, Path)):
        sources = [sources]
    files: list[Path] = []
    for src in sources:
        path = Path(src)
        if not path.exists():
            raise FileNotFoundError(f"profile source {str(path)!r} does not exist")
        if path.is_file():  # the sources of load_runs: a metrics.jsonl's folder may hold a profile.json
            cand = path if path.name.endswith("profile.json") else path.parent / "profile.json"
            if path.name == "metrics.jsonl" and cand.exists() or cand is path:
                files.append(cand)
        else:
            files += [f for f in sorted(path.rglob("*profile.json"))
                      if not any(part.startswith(".") for part in f.relative_to(path).parts)]
    rows = []
    for f in files:
        raw = json.loads(f.read_text())
        if "profile" in raw:  # harness side file: {"run": ..., "profile": ...}; its "variant" is the harness's name
            run, prof = raw.get("run", {}), raw["profile"]
            run = {**run, "variant": variant_label(run)}
        else:  # a trainer output folder's profile.json: what ran is read as load_runs reads that folder
            prof = raw
            one = load_runs(f.parent) if (f.parent / "metrics.jsonl").exists() else pd.DataFrame()
            run = {k: v for k, v in one.iloc[0].to_dict().items() if not (np.isscalar(v) and pd.isna(v))} if len(one) else {}
            run.setdefault("run_id", f.parent.name)
        if "categories_ms" not in prof:
            raise ValueError(f"{display_path(f)}: not a profile (no categories_ms)")
        meta = {"run_id": run.get("run_id", f.stem.replace(".profile", "")), "model": run.get("model"),
                "variant": run.get("variant") or variant_label(run), "precision": run.get("precision"), "layout": layout_label(run),
                "total_ms": prof.get("time_ms_per_step"), "step_ms": prof.get("unprofiled_step_ms"),
                "gpu_busy": prof.get("gpu_busy"), "source": display_path(f), "note": prof.get("note", "")}
        rows += [{**meta, "category": cat, "ms": ms} for cat, ms in prof["categories_ms"].items()]
    return pd.DataFrame(rows, columns=cols)


def display_path(path: Path) -> str:
    """A path as shown in tables: relative to the repository or the working folder, never absolute."""
    path = Path(path).resolve()
    for base in (REPO_ROOT, Path.cwd()):
        try:
            return path.relative_to(base.resolve()).as_posix()
        except ValueError:
            continue
    return "/".join(path.parts[-2:])


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, object) for each record; a truncated last line is dropped with a warning.

    A corrupt line anywhere else raises :class:`RunFileError` naming the file and line.
    """
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    records = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            is_last = i == len(lines) and not text.endswith("\n")
            if is_last:
                warnings.warn(
                    f"{path}: line {i} is incomplete (run still in progress?); read the "
                    f"{len(records)} complete record(s) before it", RunFileWarning, stacklevel=3)
                break
            raise RunFileError(f"{path}: line {i} is not valid JSON ({exc.msg}): {line[:80]!r}") from None
        if not isinstance(obj, dict):
            raise RunFileError(f"{path}: line {i} is not a JSON object: {line[:80]!r}")
        records.append((i, obj))
    return records


RUN_RECORD_REQUIRED = ("model", "precision", "gpu_name", "world_size", "command", "date")


def write_result_file(path: str | Path, run: dict, steps: Iterable[dict] = (), summary: dict | None = None) -> Path:
    """Write one run as a result file in the format of ``data/results/README.md``.

    ``run`` is the provenance (must hold at least ``RUN_RECORD_REQUIRED``); ``steps`` are
    metrics.jsonl-style dicts; ``summary`` a benchmark's own summary. Checked before writing.
    """
    missing = [k for k in RUN_RECORD_REQUIRED if k not in run]
    if missing:
        raise ValueError(f"run: missing key(s) {', '.join(missing)}; required: {', '.join(RUN_RECORD_REQUIRED)}")
    steps = [dict(s) for s in steps]
    bad = [i for i, s in enumerate(steps) if "step" not in s]
    if bad:
        raise ValueError(f"steps: record(s) {bad[:5]} have no 'step' key")
    if not steps and not summary:
        raise ValueError("steps/summary: a result file needs step records, a summary record, or both")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [{"record": "run", **{k: v for k, v in run.items() if k != "record"}}]
    lines += [{"record": "step", **{k: v for k, v in s.items() if k != "record"}} for s in steps]
    if summary:
        lines.append({"record": "summary", **{k: v for k, v in summary.items() if k != "record"}})
    path.write_text("".join(json.dumps(line, sort_keys=False) + "\n" for line in lines), encoding="utf-8")
    return path


def _flatten(d: dict) -> dict:
    """One level of nesting folded in ({"config": {...}, "provenance": {...}} -> flat keys)."""
    out: dict = {}
    for k, v in d.items():
        if isinstance(v, dict):  # e.g. {"versions": {"torch": ...}} -> torch
            for k2, v2 in v.items():
                out.setdefault(k2, v2)
        else:
            out[k] = v
    return out


def _meta(raw: dict) -> dict:
    """Canonical metadata names from any of their spellings."""
    flat = _flatten(raw)
    meta = {k: v for k, v in flat.items() if not isinstance(v, (dict, list))}
    for canon, names in _ALIASES.items():
        for n in names:
            if flat.get(n) is not None and not isinstance(flat[n], (dict, list)):
                meta[canon] = flat[n]
                break
    return meta


def _step_frame(path: Path, records: list[tuple[int, dict]], meta: dict) -> pd.DataFrame:
    for lineno, rec in records:
        if "step" not in rec:
            raise RunFileError(f"{path}: line {lineno} has no 'step' key (keys: {', '.join(sorted(rec))[:120]})")
    df = pd.DataFrame([rec for _, rec in records])
    df = df.drop(columns=[c for c in ("record",) if c in df])
    # a NaN/Infinity written in the file (not a missing value): flagged, so it is never taken for "not logged"
    df["loss_nonfinite"] = [_nonfinite(rec.get("loss")) or _nonfinite(rec.get("val_loss")) for _, rec in records]
    for k, v in meta.items():  # per-step values say what ran; the config fills what they leave out
        if k in META_COLUMNS:
            df[k] = df[k].where(df[k].notna(), v) if k in df else v
    df["record"] = "step"
    return df


def _nonfinite(v: object) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _load_trainer_dir(folder: Path) -> pd.DataFrame:
    meta: dict = {}
    cfg = folder / "config.json"
    if cfg.exists():
        try:
            meta = _meta(json.loads(cfg.read_text(encoding="utf-8")))
        except json.JSONDecodeError as exc:
            raise RunFileError(f"{cfg}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
    meta["run_id"] = folder.name
    meta.setdefault("study", folder.parent.name or "local")
    meta["source"] = display_path(folder)
    records = read_jsonl(folder / "metrics.jsonl")
    if not records:
        warnings.warn(f"{folder / 'metrics.jsonl'}: no complete records yet; run skipped", RunFileWarning, stacklevel=3)
        return pd.DataFrame()
    return _finish(_step_frame(folder / "metrics.jsonl", records, meta))


def _load_result_file(path: Path) -> pd.DataFrame:
    records = read_jsonl(path)
    if not records:
        warnings.warn(f"{path}: empty result file; skipped", RunFileWarning, stacklevel=3)
        return pd.DataFrame()
    first_line, first = records[0]
    if first.get("record") != "run":
        raise RunFileError(
            f"{path}: line {first_line} must be the run record {{\"record\": \"run\", ...}}; "
            f"found record={first.get('record')!r} (see data/results/README.md)")
    meta = _meta({k: v for k, v in first.items() if k != "record"})
    meta.setdefault("run_id", path.stem)
    meta.setdefault("study", path.parent.name)
    meta["source"] = display_path(path)
    steps, summaries = [], []
    for lineno, rec in records[1:]:
        kind = rec.get("record")
        if kind == "step":
            steps.append((lineno, rec))
        elif kind == "summary":
            summaries.append((lineno, rec))
        else:
            raise RunFileError(f"{path}: line {lineno} has record={kind!r}; allowed after line 1: 'step', 'summary'")
    frames = []
    if steps:
        frames.append(_step_frame(path, steps, meta))
    if summaries:
        rows = [{k: v for k, v in rec.items() if k != "record" and not isinstance(v, (dict, list))} for _, rec in summaries]
        s = pd.DataFrame([rows[-1]])  # the last summary wins (a rerun may append a newer one)
        for k, v in meta.items():
            if k in META_COLUMNS:
                s[k] = v
        s["record"] = "summary"
        frames.append(s)
    if not frames:
        warnings.warn(f"{path}: run record only, no step or summary records; skipped", RunFileWarning, stacklevel=3)
        return pd.DataFrame()
    return _finish(pd.concat(frames, ignore_index=True, sort=False))


def _from_collect_table(table: pd.DataFrame) -> pd.DataFrame:
    """A ``fp8lab.launch.collect`` table: metrics columns plus job metadata columns."""
    missing = [c for c in ("step",) if c not in table]
    if not {"job_name", "job", "run_id"} & set(table.columns):
        missing.append("job_name (or job)")
    if missing:
        raise ValueError(
            f"sources: the collect table lacks column(s) {', '.join(missing)}; it needs the metrics.jsonl "
            f"keys ({', '.join(METRIC_COLUMNS)}) plus job_name (or job) and instance_count")
    df = table.copy()
    renames = {}
    for canon, names in _ALIASES.items():
        if canon not in df:
            hit = next((n for n in names if n in df), None)
            if hit:
                renames[hit] = canon
    df = df.rename(columns=renames)
    if "source" not in df:
        df["source"] = "launch.collect"
    if "study" not in df:
        df["study"] = "launch"
    df["record"] = "step"
    return _finish(df)


def _finish(df: pd.DataFrame) -> pd.DataFrame:
    """Normalise values, merge records of the same step, and name each run's variant."""
    for c in COLUMNS:
        if c not in df:
            df[c] = np.nan
    if "instances" in df:
        df["instances"] = df["instances"].fillna(1)
    for c in ("precision", "backend", "recipe"):
        df[c] = df[c].map(lambda v: v.lower() if isinstance(v, str) else v)
    df["backend"] = df["backend"].replace({"none": "hf"})  # the trainer's "none" = plain transformers layers
    for c in METRIC_COLUMNS + ["world_size", "instances", "micro_batch_size", "grad_accum", "seq_len"]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    steps = df[df["record"] == "step"]
    if len(steps) and steps.duplicated(["run_id", "step"]).any():
        # a validation record may come as its own line for the same step: merge, first non-null wins
        merged = steps.groupby(["run_id", "step"], sort=False, as_index=False).first()
        df = pd.concat([merged, df[df["record"] != "step"]], ignore_index=True, sort=False)
    df["variant"] = [variant_label(r) for r in df.to_dict("records")]
    return df.sort_values(["run_id", "record", "step"], na_position="last", kind="stable")


def _unique_run_ids(df: pd.DataFrame) -> pd.Series:
    """Run ids made unique across sources (two folders both named 'bf16' stay apart)."""
    ids = df["run_id"].astype(str)
    per_id = df.groupby(ids)["source"].nunique()
    clash = set(per_id[per_id > 1].index)
    if not clash:
        return ids
    return pd.Series([f"{i} ({s})" if i in clash else i for i, s in zip(ids, df["source"])], index=df.index)


def variant_label(row: dict) -> str:
    """Short name of what ran: precision, backend, recipe, fused or not (e.g. 'fp8 te delayed fused')."""
    parts = []
    fp8 = is_fp8(row.get("precision"))
    for key in ("precision", "backend", "recipe") if fp8 else ("precision", "backend"):
        v = row.get(key)
        if isinstance(v, str) and v and v not in parts and v != "none":
            parts.append(v)
    fuse = row.get("fuse")
    if isinstance(fuse, (bool, np.bool_)) and fp8 and row.get("backend") != "torchao":  # torchao always swaps Linear layers
        parts.append("fused" if fuse else "unfused")
    spec = row.get("recipe_spec") if isinstance(row.get("recipe_spec"), str) else row.get("recipe")
    if fp8 and isinstance(spec, str) and ":" in spec:  # a recipe with its own settings (amax history, margin)
        parts.append("(" + spec.partition(":")[2] + ")")
    edge = row.get("bf16_edge_blocks")
    if fp8 and isinstance(edge, (int, float, np.integer, np.floating)) and not pd.isna(edge) and edge > 0:
        parts.append(f"bf16-edge-blocks={int(edge)}")
    if _is_true(row.get("activation_checkpointing")):
        parts.append("act-ckpt")
    if _is_true(row.get("compile")):
        parts.append("compile")
    if row.get("param_dtype") == "bf16":
        parts.append("bf16-params")
    parallel = row.get("parallel")
    ws = row.get("world_size")
    one_process = isinstance(ws, (int, float, np.integer, np.floating)) and not pd.isna(ws) and ws <= 1
    if isinstance(parallel, str) and parallel and not one_process:  # several GPUs: DDP and FSDP2 are different set-ups
        parts.append(parallel)
        if _is_true(row.get("fsdp_keep_weights")):
            parts.append("keep-weights")
    return " ".join(parts) or "unknown"


def is_fp8(precision: object) -> bool:
    return isinstance(precision, str) and precision.lower().startswith("fp8")


def model_size_b(name: object) -> float:
    """Parameter count in billions parsed from a model name ('llama-1b' -> 1.0, 'x-125m' -> 0.125)."""
    if not isinstance(name, str):
        return math.nan
    m = re.search(r"(\d+(?:\.\d+)?)\s*([mb])(?![a-z])", name.lower())
    if not m:
        return math.nan
    return float(m.group(1)) * (1e-3 if m.group(2) == "m" else 1.0)


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The source blog's headline figures (reported by the source, not measured here)."""
    path = Path(path) if path else DATA_DIR / "reference" / "source_blog.json"
    ref = json.loads(Path(path).read_text(encoding="utf-8"))
    df = pd.DataFrame(ref["results"]).drop(columns=["approximate"], errors="ignore")
    df["label"] = ref["label"]
    df["hardware"] = ref["hardware"]
    df["tokens"] = float(ref["tokens"])
    return df


def describe(runs: pd.DataFrame) -> str:
    """One line saying what was loaded (or that nothing was), for notebooks and reports."""
    if not len(runs):
        return ("No measured runs yet: data/results/ holds no result files (or the given sources are empty). "
                "Only the source blog's reported figures are shown; they are not measured here.")
    n = runs["run_id"].nunique()
    steps = int((runs["record"] == "step").sum())
    summaries = runs.loc[runs["record"] == "summary", "run_id"].nunique()
    models = ", ".join(sorted(map(str, runs["model"].dropna().unique()))) or "unknown models"
    gpus = ", ".join(sorted(map(str, runs["gpu_name"].dropna().unique()))) or "unknown GPU"
    return (f"{n} measured run(s) of {models} on {gpus}: {steps} step record(s)"
            f"{f' and {summaries} benchmark summary record(s)' if summaries else ''}.")


# --------------------------------------------------------------------------------- summaries

def _check_smoothing(smoothing: str, span: int) -> None:
    if smoothing not in SMOOTHING_METHODS:
        raise ValueError(f"smoothing={smoothing!r}; allowed: {', '.join(SMOOTHING_METHODS)}")
    if not isinstance(span, (int, np.integer)) or isinstance(span, bool) or span < 1:
        raise ValueError(f"smoothing_span={span!r}; allowed: an integer >= 1")


def smooth(values: Sequence[float] | pd.Series, smoothing: str = "ema", span: int = 20) -> pd.Series:
    """Smoothed loss: exponential moving average ('ema', span like pandas), trailing mean ('window') or 'none'."""
    _check_smoothing(smoothing, span)
    s = pd.Series(values, dtype="float64").reset_index(drop=True)
    if smoothing == "ema":
        return s.ewm(span=span, adjust=True, ignore_na=True).mean()
    if smoothing == "window":
        return s.rolling(span, min_periods=1).mean()
    return s


def summarize_runs(runs: pd.DataFrame, warmup_steps: int = 10, smoothing: str = "ema",
                   smoothing_span: int = 20) -> pd.DataFrame:
    """One row per run: steady-state tokens/s/GPU (median, quartiles, spread), MFU, memory, loss.

    The first ``warmup_steps`` steps of each run (by step number, counted from its first logged step)
    are left out of throughput and MFU (compilation, allocator and FP8 amax warm-up). A benchmark's summary record, measured with its own timing,
    takes precedence over numbers derived from its steps.
    """
    if not isinstance(warmup_steps, (int, np.integer)) or isinstance(warmup_steps, bool) or warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps!r}; allowed: an integer >= 0")
    _check_smoothing(smoothing, smoothing_span)
    rows = []
    for run_id, g in runs.groupby("run_id", sort=False):
        meta = {c: g[c].dropna().iloc[0] if g[c].notna().any() else np.nan for c in META_COLUMNS if c != "run_id"}
        steps = g[g["record"] == "step"].sort_values("step")
        summ = g[g["record"] == "summary"]
        summ = summ.iloc[-1] if len(summ) else None
        timed = steps[steps["tokens_per_sec_per_gpu"].notna()]
        # by step number, not position: downsampled files keep exact step numbers
        steady = timed[timed["step"] >= timed["step"].min() + warmup_steps] if len(timed) else timed
        row = {"run_id": run_id, **meta, "n_steps": int(steps["step"].nunique())}
        tps = steady["tokens_per_sec_per_gpu"]
        row.update(
            tokens_per_sec_per_gpu=tps.median() if len(tps) else np.nan,
            tps_p25=tps.quantile(0.25) if len(tps) else np.nan,
            tps_p75=tps.quantile(0.75) if len(tps) else np.nan,
            steady_steps=len(tps),
            mfu=steady["mfu"].median() if steady["mfu"].notna().any() else np.nan,
            step_time_s=steady["step_time_s"].median() if steady["step_time_s"].notna().any() else np.nan,
            max_mem_gib=steps["max_mem_gib"].max() if steps["max_mem_gib"].notna().any() else np.nan,
            tokens=steps["tokens"].max() if steps["tokens"].notna().any() else np.nan,
        )
        note = []
        if len(timed) and not len(steady):
            note.append(f"all {len(timed)} timed steps fall within warmup_steps={warmup_steps}")
        throughput_from = f"median of {len(tps)} steps after {warmup_steps} warm-up" if len(tps) else "none"
        loss = steps["loss"][np.isfinite(steps["loss"])]  # skipped (overflow) steps may carry no loss
        row["final_loss"] = loss.iloc[-1] if len(loss) else np.nan
        row["smoothed_loss"] = smooth(loss, smoothing, smoothing_span).iloc[-1] if len(loss) else np.nan
        val = steps[["step", "val_loss"]].dropna()
        row["val_loss"] = val["val_loss"].iloc[-1] if len(val) else np.nan
        # NaN/Inf losses: the run is flagged and shows no loss, rather than an older or another loss
        bad = (steps["loss_nonfinite"].astype("boolean").fillna(False).to_numpy(bool) if "loss_nonfinite" in steps
               else np.zeros(len(steps), bool))
        for col in ("loss", "val_loss"):
            bad |= np.isinf(pd.to_numeric(steps[col], errors="coerce").to_numpy(float))
        row["nonfinite_losses"] = int(bad.sum())
        if bad.any():
            note.append(f"{int(bad.sum())} non-finite loss value(s) (NaN/Inf), the first at step "
                        f"{steps['step'].to_numpy()[bad].min():g}: loss not reported or compared")
            row["final_loss"] = row["smoothed_loss"] = row["val_loss"] = np.nan
        if summ is not None:
            if pd.notna(summ.get("tokens_per_sec_per_gpu")):
                row["tokens_per_sec_per_gpu"] = summ["tokens_per_sec_per_gpu"]
                row["tps_p25"] = summ.get("tokens_per_sec_per_gpu_p25", np.nan)
                row["tps_p75"] = summ.get("tokens_per_sec_per_gpu_p75", np.nan)
                row["steady_steps"] = summ.get("timed_steps", np.nan)
                throughput_from = "benchmark summary record"
                if pd.isna(row["tps_p25"]) and pd.notna(summ.get("tokens_per_sec_per_gpu_min", np.nan)):
                    row["tps_p25"] = summ["tokens_per_sec_per_gpu_min"]  # no quartiles: min-max of repeats
                    row["tps_p75"] = summ.get("tokens_per_sec_per_gpu_max", np.nan)
                    throughput_from += " (spread: min-max of repeats)"
            for key, src in (("mfu", "mfu"), ("max_mem_gib", "max_mem_gib"), ("step_time_s", "step_time_s"),
                             ("tokens", "tokens"), ("val_loss", "val_loss")):
                if pd.notna(summ.get(src, np.nan)):
                    row[key] = summ[src]
            for key in ("final_loss", "loss"):
                if pd.isna(row["final_loss"]) and pd.notna(summ.get(key, np.nan)):
                    row["final_loss"] = row["smoothed_loss"] = summ[key]
        for k in ("tps_p25", "tps_p75"):
            row[k] = pd.to_numeric(row[k], errors="coerce")
        row["tps_iqr"] = row["tps_p75"] - row["tps_p25"]
        row["tps_spread_pct"] = 100 * row["tps_iqr"] / row["tokens_per_sec_per_gpu"] if row["tokens_per_sec_per_gpu"] else np.nan
        row["throughput_from"] = throughput_from
        row["note"] = "; ".join(note)
        rows.append(row)
    cols = (["run_id"] + [c for c in META_COLUMNS if c != "run_id"] +
            ["n_steps", "steady_steps", "tokens", "tokens_per_sec_per_gpu", "tps_p25", "tps_p75", "tps_iqr",
             "tps_spread_pct", "mfu", "step_time_s", "max_mem_gib", "final_loss", "smoothed_loss", "val_loss",
             "nonfinite_losses", "throughput_from", "note"])
    return pd.DataFrame(rows, columns=cols)


def _is_true(v: object) -> bool:
    """An explicit True (Python or numpy bool; a missing value or a number is not True)."""
    return isinstance(v, (bool, np.bool_)) and bool(v)


def is_false(v: object) -> bool:
    """An explicit False (a missing value is not False)."""
    return v is not None and not (isinstance(v, float) and math.isnan(v)) and not bool(v)


def group_key(v: object) -> object:
    """A value fit for a groupby key: a missing value (None, NaN) becomes "?"."""
    return "?" if v is None or (isinstance(v, float) and math.isnan(v)) else v


def _hardware_fp8(run: pd.Series) -> bool:
    """Whether a run's FP8 ran on FP8 hardware (not the PyTorch emulation, not a CPU)."""
    gpu = run.get("gpu_name")
    return (run.get("backend") != "emulated" and isinstance(gpu, str)
            and not any(w in gpu.lower() for w in ("cpu", "mps")))


def layout_label(row) -> str:
    """Sequences x tokens per micro-batch and accumulation steps, e.g. '8x2048, accum 4'."""
    def num(k):
        v = row.get(k)
        return int(v) if isinstance(v, (int, float, np.integer, np.floating)) and not pd.isna(v) else None
    mb, seq, ga = num("micro_batch_size"), num("seq_len"), num("grad_accum")
    if mb is None or seq is None:
        return "-"
    return f"{mb}x{seq}" + (f", accum {ga}" if ga and ga > 1 else "")


def compare_precisions(summary: pd.DataFrame, baseline_backend: str | None = None,
                       loss: str = "smoothed", by_layout: bool = True) -> pd.DataFrame:
    """FP8 against BF16 per model and scale: speedup and loss gap in percent.

    Runs pair when they share model, GPU, instance count and world size and (``by_layout``) study,
    micro-batch, accumulation steps and sequence length. The BF16 baseline is the
    fastest BF16 run of that scale, or the one with ``baseline_backend`` (e.g. 'hf' for plain
    transformers). Loss gaps are given only when both runs saw the same number of tokens
    (``valid``); otherwise ``note`` says why. Speedup compares steady-state rates either way.
    ``loss``: 'smoothed' or 'final' training loss for ``loss_gap_pct`` (``val_loss_gap_pct`` too).
    """
    if loss not in ("smoothed", "final"):
        raise ValueError(f"loss={loss!r}; allowed: 'smoothed', 'final'")
    cols = ["model", "gpu_name", "instances", "world_size", "layout", "study", "baseline_run", "baseline_variant", "fp8_run",
            "fp8_variant", "tps_baseline", "tps_fp8", "speedup", "mfu_baseline", "mfu_fp8", "tokens_baseline",
            "tokens_fp8", "valid", "hardware_fp8", "loss_baseline", "loss_fp8", "loss_gap_pct", "val_loss_baseline",
            "val_loss_fp8", "val_loss_gap_pct", "note"]
    rows = []
    if not len(summary):
        return pd.DataFrame(columns=cols)
    keys = SCALE_KEYS + (LAYOUT_KEYS if by_layout else ())
    keyed = summary.assign(**{f"_{k}": (summary[k] if k in summary else pd.Series(None, index=summary.index, dtype=object)).map(group_key)
                              for k in keys})
    for scale, g in keyed.groupby([f"_{k}" for k in keys], sort=True, dropna=False):
        bf16 = g[g["precision"] == "bf16"]
        if baseline_backend is not None:
            bf16 = bf16[bf16["backend"] == baseline_backend]
        bf16 = bf16[bf16["tokens_per_sec_per_gpu"].notna()]
        fp8 = g[g["precision"].map(is_fp8)]
        if not len(bf16) or not len(fp8):
            continue
        base = bf16.loc[bf16["tokens_per_sec_per_gpu"].idxmax()]
        lcol = "smoothed_loss" if loss == "smoothed" else "final_loss"
        for _, r in fp8.iterrows():
            note = []
            hardware = _hardware_fp8(r)
            if not hardware:
                note.append("FP8 emulated or on CPU: its speed says nothing about FP8 hardware")
            same = pd.notna(base["tokens"]) and pd.notna(r["tokens"]) and base["tokens"] == r["tokens"]
            nonfinite = [x["run_id"] for x in (base, r) if x.get("nonfinite_losses", 0) > 0]
            if nonfinite:
                note.append(f"non-finite loss (NaN/Inf) in {', '.join(map(str, nonfinite))}: loss not compared")
            if is_false(base.get("loss_comparable")) or is_false(r.get("loss_comparable")):
                same = False
                note.append("throughput run: too short for a loss comparison (see the loss-parity study)")
            elif pd.isna(base["tokens"]) or pd.isna(r["tokens"]):
                note.append("tokens seen unknown: loss not compared")
            elif not same:
                note.append(f"different tokens seen ({base['tokens']:.0f} vs {r['tokens']:.0f}): loss not compared")
            gap = 100 * (r[lcol] - base[lcol]) / base[lcol] if same and not nonfinite else np.nan
            vgap = 100 * (r["val_loss"] - base["val_loss"]) / base["val_loss"] if same and not nonfinite else np.nan
            rows.append({
                **dict(zip(SCALE_KEYS, [base[k] for k in SCALE_KEYS])),
                "layout": layout_label(base) if by_layout else "-", "study": base.get("study"),
                "baseline_run": base["run_id"], "baseline_variant": base["variant"],
                "fp8_run": r["run_id"], "fp8_variant": r["variant"],
                "tps_baseline": base["tokens_per_sec_per_gpu"], "tps_fp8": r["tokens_per_sec_per_gpu"],
                "speedup": r["tokens_per_sec_per_gpu"] / base["tokens_per_sec_per_gpu"],
                "mfu_baseline": base["mfu"], "mfu_fp8": r["mfu"],
                "tokens_baseline": base["tokens"], "tokens_fp8": r["tokens"], "valid": bool(same),
                "hardware_fp8": hardware,
                "loss_baseline": base[lcol], "loss_fp8": r[lcol], "loss_gap_pct": gap,
                "val_loss_baseline": base["val_loss"], "val_loss_fp8": r["val_loss"], "val_loss_gap_pct": vgap,
                "note": "; ".join(note),
            })
    out = pd.DataFrame(rows, columns=cols)
    if len(out):  # smallest model first, then scale, then fastest FP8 variant
        order = out.assign(_size=out["model"].map(model_size_b).fillna(np.inf), _neg=-out["speedup"])
        out = out.loc[order.sort_values(["_size", "model", "world_size", "instances", "_neg"]).index]
    return out.reset_index(drop=True)


# ------------------------------------------------------------------------------ headline view
# What a reader needs first, per model: the plain `transformers` BF16 run a user starts from, the
# best BF16 fp8lab measured, the best FP8 (overall and per recipe), the loss gap of the loss study,
# and the source's reported figure. Every row names the run it comes from.

HEADLINE_COLUMNS = [
    "model", "gpu_name", "world_size",
    "hf_run", "hf_variant", "hf_layout", "tps_hf",
    "bf16_run", "bf16_variant", "bf16_layout", "tps_bf16", "mfu_bf16",
    "fp8_run", "fp8_variant", "fp8_layout", "tps_fp8", "mfu_fp8", "hardware_fp8",
    "speedup", "speedup_vs_hf",
    "loss_gap_pct", "loss_gap_kind", "loss_fp8_run", "loss_baseline_run", "loss_fp8_variant", "loss_study", "loss_tokens",
    "source_model_size", "source_speedup", "source_loss_gap_pct",
]
BEST_RUN_COLUMNS = ["model", "gpu_name", "world_size", "role", "run_id", "variant", "layout", "precision", "backend",
                    "recipe", "study", "tokens_per_sec_per_gpu", "mfu", "relative_to_best_bf16", "hardware_fp8"]


def _is_plain_hf(row) -> bool:
    """Plain `transformers` layers, not compiled: what a user runs before trying anything."""
    return row.get("backend") == "hf" and not _is_true(row.get("compile"))


def _headline_groups(summary: pd.DataFrame) -> list[tuple[tuple, pd.DataFrame]]:
    """(model, GPU) groups at their smallest measured scale (one GPU where measured), smallest model first."""
    s = summary[summary["tokens_per_sec_per_gpu"].notna()] if len(summary) else summary
    out = []
    for (model, gpu), g in s.groupby([s["model"].map(group_key), s["gpu_name"].map(group_key)], sort=False):
        inst = g["instances"].fillna(1)
        g = g[inst == inst.min()]
        ws = g["world_size"].fillna(1)
        out.append(((model, gpu), g[ws == ws.min()]))
    return sorted(out, key=lambda kg: (np.nan_to_num(model_size_b(kg[0][0]), nan=np.inf), str(kg[0][0]), str(kg[0][1])))


def best_runs(summary: pd.DataFrame) -> pd.DataFrame:
    """Per model (and GPU), at its smallest measured scale, the runs a headline shows: ``role`` is
    'plain HF BF16' (fastest plain `transformers` BF16 run, not compiled), 'best BF16' (fastest BF16 run
    of any backend), 'best FP8' (fastest FP8 run), and 'FP8 <backend> <recipe>' (fastest FP8 run per
    backend and recipe kind, fastest first). ``relative_to_best_bf16`` is tokens/s/GPU over the best BF16's."""
    rows = []
    for (model, gpu), g in _headline_groups(summary):
        bf16 = g[g["precision"] == "bf16"]
        fp8 = g[g["precision"].map(is_fp8)]
        hw = fp8[[_hardware_fp8(r) for _, r in fp8.iterrows()]]
        fp8 = hw if len(hw) else fp8  # emulated FP8 only where nothing ran on FP8 hardware
        picks = []
        hf = bf16[[_is_plain_hf(r) for _, r in bf16.iterrows()]]
        if len(hf):
            picks.append(("plain HF BF16", hf.loc[hf["tokens_per_sec_per_gpu"].idxmax()]))
        if len(bf16):
            picks.append(("best BF16", bf16.loc[bf16["tokens_per_sec_per_gpu"].idxmax()]))
        if len(fp8):
            picks.append(("best FP8", fp8.loc[fp8["tokens_per_sec_per_gpu"].idxmax()]))
            kinds = fp8.assign(_kind=[f"FP8 {r['backend']} {r['recipe']}" for _, r in fp8.iterrows()])
            best = [kinds.loc[k["tokens_per_sec_per_gpu"].idxmax()] for _, k in kinds.groupby("_kind", sort=True)]
            picks += [(r["_kind"], r) for r in sorted(best, key=lambda r: -r["tokens_per_sec_per_gpu"])]
        ref = picks[[p[0] for p in picks].index("best BF16")][1]["tokens_per_sec_per_gpu"] if len(bf16) else np.nan
        for role, r in picks:
            rows.append({"model": model, "gpu_name": gpu, "world_size": r["world_size"], "role": role,
                         "run_id": r["run_id"], "variant": r["variant"], "layout": layout_label(r),
                         "precision": r["precision"], "backend": r["backend"], "recipe": r["recipe"],
                         "study": r["study"], "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"], "mfu": r["mfu"],
                         "relative_to_best_bf16": r["tokens_per_sec_per_gpu"] / ref,
                         "hardware_fp8": _hardware_fp8(r) if is_fp8(r["precision"]) else np.nan})
    return pd.DataFrame(rows, columns=BEST_RUN_COLUMNS)


def _headline_loss(comparison: pd.DataFrame, summary: pd.DataFrame, model: str, recipe: object) -> dict | None:
    """The loss gap a headline quotes for ``model``: from the runs that saw the same tokens, preferring
    the FP8 recipe of the best FP8 run without loss remedies (own recipe settings, BF16 edge blocks),
    then the most tokens, then the newest study."""
    if not len(comparison):
        return None
    c = comparison[(comparison["model"] == model) & comparison["valid"].astype(bool)]
    c = c[c["val_loss_gap_pct"].notna() | c["loss_gap_pct"].notna()]
    if not len(c):
        return None
    meta = summary.drop_duplicates("run_id").set_index("run_id")

    def rank(r):
        m = meta.loc[r["fp8_run"]] if r["fp8_run"] in meta.index else {}
        spec = m.get("recipe_spec") if isinstance(m.get("recipe_spec"), str) else ""
        edge = m.get("bf16_edge_blocks")
        plain = ":" not in spec and not (isinstance(edge, (int, float, np.integer, np.floating)) and not pd.isna(edge) and edge > 0)
        when = pd.to_datetime(m.get("date"), utc=True, errors="coerce")
        return (m.get("recipe") == recipe, plain, r["tokens_fp8"], when.value if pd.notna(when) else 0)

    r = max((r for _, r in c.iterrows()), key=rank)
    val = pd.notna(r["val_loss_gap_pct"])
    return {"loss_gap_pct": r["val_loss_gap_pct"] if val else r["loss_gap_pct"],
            "loss_gap_kind": "validation loss" if val else "smoothed training loss",
            "loss_fp8_run": r["fp8_run"], "loss_baseline_run": r["baseline_run"], "loss_fp8_variant": r["fp8_variant"],
            "loss_study": r["study"], "loss_tokens": r["tokens_fp8"]}


def headline_table(summary: pd.DataFrame, comparison: pd.DataFrame | None = None,
                   reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per model (and GPU) at its smallest measured scale: plain `transformers` BF16, best BF16,
    best FP8 (tokens/s/GPU, MFU, the run behind each), the speedup of best FP8 over best BF16 and over
    plain transformers, the FP8 loss gap of the loss study (see :func:`_headline_loss`), and the source's
    reported figures for the same model size (NaN where the source reported none)."""
    comparison = compare_precisions(summary) if comparison is None else comparison
    best = best_runs(summary)
    rows = []
    for (model, gpu), g in best.groupby([best["model"], best["gpu_name"].map(group_key)], sort=False):
        pick = {r["role"]: r for _, r in g.iterrows()}
        row = {"model": model, "gpu_name": gpu, "world_size": g["world_size"].iloc[0]}
        for prefix, role in (("hf", "plain HF BF16"), ("bf16", "best BF16"), ("fp8", "best FP8")):
            r = pick.get(role)
            row.update({f"{prefix}_run": r["run_id"] if r is not None else None,
                        f"{prefix}_variant": r["variant"] if r is not None else None,
                        f"{prefix}_layout": r["layout"] if r is not None else None,
                        f"tps_{prefix}": r["tokens_per_sec_per_gpu"] if r is not None else np.nan})
            if prefix != "hf":
                row[f"mfu_{prefix}"] = r["mfu"] if r is not None else np.nan
        row["hardware_fp8"] = bool(pick["best FP8"]["hardware_fp8"]) if "best FP8" in pick else np.nan
        row["speedup"] = row["tps_fp8"] / row["tps_bf16"]
        row["speedup_vs_hf"] = row["tps_fp8"] / row["tps_hf"]
        row.update(_headline_loss(comparison, summary, model, pick["best FP8"]["recipe"] if "best FP8" in pick else None)
                   or {})
        if reference is not None and len(reference):
            same = reference[np.isclose(reference["params_b"], model_size_b(model))]
            if len(same):
                row.update(source_model_size=same["model_size"].iloc[0], source_speedup=same["speedup"].iloc[0],
                           source_loss_gap_pct=same["loss_gap_pct"].iloc[0])
        rows.append(row)
    return pd.DataFrame(rows, columns=HEADLINE_COLUMNS)


def headline_runs(runs: pd.DataFrame, summary: pd.DataFrame, headline: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The runs behind a headline: (loss runs: every run of each model's loss study, for the loss figure;
    best: the summary rows of each model's best BF16 and best FP8 run, for time and cost)."""
    loss_keys = {(m, s) for m, s in zip(headline["model"], headline["loss_study"]) if isinstance(s, str)}
    loss = runs[[(m, s) in loss_keys for m, s in zip(runs["model"], runs["study"])]] if len(runs) else runs
    ids = set(headline["bf16_run"].dropna()) | set(headline["fp8_run"].dropna())
    return loss, summary[summary["run_id"].isin(ids)]


DETAILS = ("headline", "all")  # notebook 05's views: the answer per model, or every run


def check_detail(detail: str) -> str:
    """``detail`` if it names a view of notebook 05 ('headline' or 'all'), else a ValueError listing them."""
    if detail not in DETAILS:
        raise ValueError(f"detail={detail!r}; allowed: {', '.join(map(repr, DETAILS))}")
    return detail


def select_runs(runs: pd.DataFrame, models: Sequence[str] | None = None, studies: Sequence[str] | None = None,
                variant: str | None = None) -> pd.DataFrame:
    """The runs of the given models and studies whose variant label contains ``variant`` (None or empty:
    no filter). Names that match nothing are an error listing the names there are."""
    out = runs
    for col, wanted in (("model", models), ("study", studies)):
        if wanted:
            if isinstance(wanted, str):
                wanted = [wanted]
            there = sorted(map(str, runs[col].dropna().unique()))
            unknown = sorted(set(wanted) - set(there))
            if unknown:
                raise ValueError(f"{col}s={list(wanted)!r}: no runs of {', '.join(unknown)}; there are: {', '.join(there)}")
            out = out[out[col].isin(wanted)]
    if variant:
        out = out[out["variant"].astype(str).str.contains(variant, regex=False)]
        if not len(out):
            raise ValueError(f"variant={variant!r}: no run's variant contains it; variants: "
                             f"{', '.join(sorted(map(str, runs['variant'].dropna().unique())))}")
    return out


def _check_cost_args(tokens: float, price: float, gpus_per_instance: int) -> None:
    if not (isinstance(tokens, (int, float)) and tokens > 0):
        raise ValueError(f"tokens={tokens!r}; allowed: a number > 0 (e.g. 24e9)")
    if not (isinstance(price, (int, float)) and price >= 0):
        raise ValueError(f"price_per_instance_hour={price!r}; allowed: a number >= 0 (USD)")
    if not isinstance(gpus_per_instance, (int, np.integer)) or gpus_per_instance < 1:
        raise ValueError(f"gpus_per_instance={gpus_per_instance!r}; allowed: an integer >= 1")


def cost_table(summary: pd.DataFrame, tokens: float = DEFAULT_TOKEN_BUDGET,
               price_per_instance_hour: float = DEFAULT_PRICE_PER_INSTANCE_HOUR,
               gpus_per_instance: int = DEFAULT_GPUS_PER_INSTANCE) -> pd.DataFrame:
    """Time and cost to train ``tokens`` at each run's steady tokens/s/GPU.

    The cluster is the run's instance count, each with ``gpus_per_instance`` GPUs running at the
    measured per-GPU rate. Where the run used fewer GPUs than that (e.g. one H200), the figure is a
    projection (``projected`` = True), assuming the per-GPU rate holds on a full instance.
    """
    _check_cost_args(tokens, price_per_instance_hour, gpus_per_instance)
    out = summary[["run_id", "model", "precision", "variant", "gpu_name", "instances", "world_size",
                   "tokens_per_sec_per_gpu"]].copy()
    inst = out["instances"].fillna(1).clip(lower=1)
    gpus = inst * gpus_per_instance
    out["cluster_gpus"] = gpus
    out["hours"] = tokens / (out["tokens_per_sec_per_gpu"] * gpus) / 3600.0
    out["cost_usd"] = out["hours"] * inst * price_per_instance_hour
    out["projected"] = out["world_size"].fillna(1) != gpus
    out["token_budget"] = float(tokens)
    out["price_per_instance_hour"] = float(price_per_instance_hour)
    return out


def _setup_label(row: dict) -> str:
    """The set-up a scaling row compares: what ran (``variant_label``) and the layout, without the
    scale and the data-parallel mode, e.g. 'fp8 te delayed fused bf16-params, 16x2048, accum 4'."""
    one = {**row, "parallel": None}
    return f"{variant_label(one)}, {layout_label(row)}"


def scaling_table(summary: pd.DataFrame, by: str = "auto") -> pd.DataFrame:
    """Per-GPU scaling efficiency of each run against the same set-up at the smallest scale.

    Runs count as one set-up when model, GPU, precision, backend, recipe, parameter dtype and layout
    (micro-batch, accumulation, sequence) agree; the variant's name and the data-parallel mode do not
    matter. The reference is the smallest-scale run of the set-up measured closest in time (the same
    session and machine where there is one: GPUs of one kind differ by a few percent between machines);
    ``efficiency_vs_fastest`` divides by the fastest smallest-scale run instead. Set-ups measured at one
    scale only are left out. 1.0 means perfect linear scaling. ``by``: 'instances', 'world_size'
    (GPUs), or 'auto' (instances when runs differ in instance count, else GPUs).
    """
    if by == "auto":
        by = "instances" if summary["instances"].nunique() > 1 else "world_size"
    if by not in ("instances", "world_size"):
        raise ValueError(f"by={by!r}; allowed: 'auto', 'instances', 'world_size'")
    kept = ["model", "gpu_name", "variant", "precision", "instances", "world_size", "run_id", "tokens_per_sec_per_gpu"]
    cols = kept + ["reference_run_id", "reference_tokens_per_sec_per_gpu", "hours_apart", "efficiency", "efficiency_vs_fastest"]
    s = summary[summary["tokens_per_sec_per_gpu"].notna() & summary[by].notna()].copy()
    empty = pd.DataFrame(columns=cols)
    empty.attrs["by"] = by
    if not len(s):
        return empty
    s["variant"] = [_setup_label(r) for r in s.to_dict("records")]
    s["_when"] = pd.to_datetime(s["date"], utc=True, errors="coerce") if "date" in s else pd.NaT
    keys = [s["model"].map(group_key), s["gpu_name"].map(group_key), s["variant"]]
    rows = []

    def row(r: pd.Series, ref: pd.Series, hours: float, fastest: float) -> dict:
        return {**{c: r[c] for c in kept}, "reference_run_id": ref["run_id"],
                "reference_tokens_per_sec_per_gpu": ref["tokens_per_sec_per_gpu"], "hours_apart": hours,
                "efficiency": r["tokens_per_sec_per_gpu"] / ref["tokens_per_sec_per_gpu"],
                "efficiency_vs_fastest": r["tokens_per_sec_per_gpu"] / fastest}

    for _, g in s.groupby(keys, sort=True):
        if g[by].nunique() < 2:
            continue
        base = g[g[by] == g[by].min()]
        fastest = float(base["tokens_per_sec_per_gpu"].max())
        used: set = set()
        for _, r in g.sort_values([by, "run_id"]).iterrows():
            if r[by] == base[by].iloc[0]:
                continue
            gap = (base["_when"] - r["_when"]).abs()
            ref = base.loc[gap.idxmin()] if gap.notna().any() else base.sort_values("tokens_per_sec_per_gpu").iloc[len(base) // 2]
            used.add(ref["run_id"])
            hours = gap[ref.name] / pd.Timedelta(hours=1) if gap.notna().any() else float("nan")
            rows.append(row(r, ref, hours, fastest))
        for _, r in base[base["run_id"].isin(used)].iterrows():  # the references themselves, at 1.0
            rows.append(row(r, r, 0.0, fastest))
    if not rows:
        return empty
    out = pd.DataFrame(rows)[cols].sort_values(["model", "variant", by, "run_id"], ignore_index=True)
    out.attrs["by"] = by  # the scale column the efficiencies are over (plots and reports read it)
    return out


def scaling_axis(scaling: pd.DataFrame) -> str:
    """The scale column a ``scaling_table`` compares over: 'instances' or 'world_size'."""
    return scaling.attrs.get("by") or ("instances" if scaling["instances"].nunique() > 1 else "world_size")


# ----------------------------------------------------------------------------------- verdict

def fmt_tokens(n: float) -> str:
    """A token count the way the verdict says it: 24e9 -> "24B", 4.9e6 -> "4.9M"."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:.4g}{unit}"
    return f"{n:,.0f}"


def verdict(comparison: pd.DataFrame, tokens: float = DEFAULT_TOKEN_BUDGET,
            price_per_instance_hour: float = DEFAULT_PRICE_PER_INSTANCE_HOUR,
            gpus_per_instance: int = DEFAULT_GPUS_PER_INSTANCE, reference: pd.DataFrame | None = None,
            loss_tolerance_pct: float = 1.0) -> str:
    """A one-paragraph verdict written from the comparison table (never by hand).

    Per model it takes the fastest FP8 variant at the smallest scale measured, states its speedup,
    loss gap (only from runs that saw the same tokens), and the cost saved on ``tokens``; then the
    source's reported figures, labelled as such. Missing pieces are said, not guessed.
    """
    _check_cost_args(tokens, price_per_instance_hour, gpus_per_instance)
    if not (isinstance(loss_tolerance_pct, (int, float)) and loss_tolerance_pct >= 0):
        raise ValueError(f"loss_tolerance_pct={loss_tolerance_pct!r}; allowed: a number >= 0 (percent)")
    parts = []
    comp = comparison[comparison["speedup"].notna()] if len(comparison) else comparison
    if not len(comp):
        parts.append("There are no measured BF16/FP8 pairs yet (no runs of the same model and scale in both "
                     "precisions), so this report cannot say from its own numbers whether FP8 pays off.")
    else:
        pays, pays_unknown_loss, faster_worse, slower, emulated = [], [], [], [], []
        by_size = sorted(comp["model"].unique(), key=lambda m: (np.nan_to_num(model_size_b(m), nan=np.inf), str(m)))
        for model in by_size:
            g = comp[comp["model"] == model]
            g = g.sort_values(["world_size", "instances", "speedup"], ascending=[True, True, False])
            r = g.iloc[0]
            gpu = r["gpu_name"] if isinstance(r["gpu_name"], str) else "an unnamed GPU"
            n = int(r["world_size"]) if pd.notna(r["world_size"]) else None
            scale = f"{n} GPU{'s' if n != 1 else ''}" if n else "an unknown number of GPUs"
            where = f"a CPU ({n} process{'es' if n and n > 1 else ''})" if gpu.lower() == "cpu" else f"{scale} of {gpu}"
            lay = f" at {r['layout']}" if isinstance(r.get("layout"), str) and r["layout"] != "-" else ""
            s = (f"For {model} on {where}, {r['fp8_variant']}{lay} (run {r['fp8_run']}) ran at {r['speedup']:.2f}x "
                 f"the tokens/s/GPU of {r['baseline_variant']} (run {r['baseline_run']}) "
                 f"({r['tps_fp8']:,.0f} vs {r['tps_baseline']:,.0f})")
            if r["hardware_fp8"]:
                hours_b = tokens / (r["tps_baseline"] * gpus_per_instance) / 3600.0
                hours_f = tokens / (r["tps_fp8"] * gpus_per_instance) / 3600.0
                s += (f"; at ${price_per_instance_hour:,.2f} per {gpus_per_instance}-GPU instance-hour, "
                      f"{fmt_tokens(tokens)} tokens would cost ${hours_f * price_per_instance_hour:,.0f} instead of "
                      f"${hours_b * price_per_instance_hour:,.0f} ({100 * (1 - hours_f / hours_b):.0f}% saved)")
            else:
                s += (", but its FP8 was emulated in PyTorch or ran on a CPU: a numerics study, not a measurement "
                      "of FP8 speed or cost")
            gap_kind, gap = None, np.nan
            valid = g[g["valid"]]
            if len(valid):
                v = valid.iloc[0]
                if pd.notna(v["val_loss_gap_pct"]):
                    gap_kind, gap = "validation loss", v["val_loss_gap_pct"]
                elif pd.notna(v["loss_gap_pct"]):
                    gap_kind, gap = "smoothed training loss", v["loss_gap_pct"]
            if gap_kind and valid.iloc[0]["fp8_run"] == r["fp8_run"]:
                s += (f"; after the same {fmt_tokens(valid.iloc[0]['tokens_fp8'])} tokens its {gap_kind} was "
                      f"{gap:+.2f}% relative to BF16")
            elif gap_kind:  # speed from a throughput run, loss from a longer run of the same model
                v = valid.iloc[0]
                s += (f"; in a longer run of the same model ({v['fp8_variant']} against {v['baseline_variant']}, runs "
                      f"{v['fp8_run']} and {v['baseline_run']}, "
                      f"{fmt_tokens(v['tokens_fp8'])} tokens each, study {v['study']}) the FP8 {gap_kind} was "
                      f"{gap:+.2f}% relative to BF16")
            elif "non-finite loss" in str(r.get("note", "")):
                s += "; its loss was non-finite (NaN/Inf, flagged in the runs table), so no loss gap is given"
            elif len(valid):
                s += "; no loss was recorded, so the loss gap is unknown"
            elif "throughput run" in str(r.get("note", "")):
                s += "; these are short throughput runs, so their loss is not compared here"
            else:
                s += "; the BF16 and FP8 runs did not see the same tokens, so their loss is not compared"
            scales = comp[(comp["model"] == model) & (comp["fp8_variant"] == r["fp8_variant"])]
            if scales["world_size"].nunique() > 1:
                s += (f"; across {scales['world_size'].min():g} to {scales['world_size'].max():g} GPUs its speedup "
                      f"ranged from {scales['speedup'].min():.2f}x to {scales['speedup'].max():.2f}x")
            if reference is not None and len(reference):
                same = reference[np.isclose(reference["params_b"], model_size_b(model))]
                if len(same):
                    s += f" (the source reported {same['speedup'].iloc[0]:.2f}x at {same['model_size'].iloc[0]})"
            parts.append(s + ".")
            if not r["hardware_fp8"]:
                emulated.append(model + (f" (its loss is within {loss_tolerance_pct:g}% of BF16's)" if gap_kind and
                                         abs(gap) <= loss_tolerance_pct else ""))
            elif r["speedup"] <= 1.0:
                slower.append(model)
            elif gap_kind and gap > loss_tolerance_pct:
                faster_worse.append(model)
            elif gap_kind:
                pays.append(model)
            else:
                pays_unknown_loss.append(model)
        concl = []
        if pays:
            concl.append(f"FP8 pays off for {', '.join(pays)} (faster, loss within {loss_tolerance_pct:g}% of BF16)")
        if pays_unknown_loss:
            concl.append(f"FP8 is faster for {', '.join(pays_unknown_loss)}, but these runs do not show its loss")
        if faster_worse:
            concl.append(f"for {', '.join(faster_worse)} FP8 is faster but its loss is more than "
                         f"{loss_tolerance_pct:g}% above BF16's")
        if slower:
            concl.append(f"for {', '.join(slower)} FP8 is not faster than BF16")
        if emulated:
            concl.append(f"for {', '.join(emulated)} these runs cannot say whether FP8 is faster (no FP8 hardware)")
        parts.append("In short: " + "; ".join(concl) + ".")
    if reference is not None and len(reference):
        refs = ", ".join(f"{r['speedup']:.2f}x and ~{r['loss_gap_pct']:g}% higher loss at {r['model_size']}"
                         for _, r in reference.iterrows())
        parts.append(f"For comparison, the source blog reported (not measured here) {refs} on "
                     f"{reference['hardware'].iloc[0]}.")
    return " ".join(parts)


# -------------------------------------------------------------------------------------- CLI

def report_main(argv: Iterable[str] | None = None) -> int:
    """``fp8lab report RUNS... --out report.html``: kept for old callers; the command is :func:`fp8lab.report.main`.

    ``fp8lab.report`` builds on this module, not the other way round: this one call reaches up to
    it when made, and no module-level import does (tests/test_layering.py checks that).
    """
    from fp8lab.report import main

    return main(argv)
