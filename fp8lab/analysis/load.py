"""Reading runs into one tidy table (a row per step, with the run's metadata).

Sources: trainer output folders (``metrics.jsonl`` + ``config.json``), a ``fp8lab.launch.collect``
table (or its ``.csv``), and result files under ``data/results/`` (format:
``data/results/README.md``), which ``write_result_file`` writes. Also here: profiles
(``load_profiles``), the source blog's reported figures (``load_reference``), a line saying what
was loaded (``describe``) and choosing runs by model, study and variant (``select_runs``).
"""
from __future__ import annotations

import functools
import json
import math
import os
import stat
import warnings
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from fp8lab.fp8.stats import RECORD as FP8_STATS_RECORD
from fp8lab.analysis.labels import VARIANT_KEYS, layout_label, model_size_b, variant_label
from fp8lab.core.paths import DATA_DIR, REPO_ROOT, RESULTS_DIR, read_result_text
from fp8lab.core.progress import progress
from fp8lab.analysis.labels import LORA_SUFFIX, task_label
from fp8lab.analysis.run_config import normalize_config
from fp8lab.records.data_format import PRETRAIN

# Run metadata carried on every row of the tidy table.
META_COLUMNS = [
    "run_id", "study", "source", "model", "precision", "backend", "recipe", "fuse", "variant",
    "gpu_name", "world_size", "instances", "micro_batch_size", "grad_accum", "seq_len",
    "parallel",  # ddp | fsdp on several GPUs: runs pair only within one mode
    "param_dtype",  # fp32 (default) or bf16 parameters with fp32 master weights
    "compute_dtype",  # the trainer's non-FP8 math: auto (bf16 on a GPU, fp32 on a CPU), bf16 or fp32
    "loss_comparable",  # False for throughput runs: too short for their loss to mean anything
    "recipe_spec", "bf16_edge_blocks",  # loss remedies: recipe settings (kind:key=value,...), blocks kept out of FP8
    "seed",  # model init and data order: an FP8 run's loss pairs with the BF16 run of its seed (the loss-parity study)
    "activation_checkpointing", "fsdp_keep_weights", "compile", "cuda_graphs",
    "fp8_attention",  # TE's FP8 dot-product attention
    "nvte_fp8_dpa_bwd",  # its backward: "1" FP8 (fp8lab's choice), "0" BF16
    "fp8_lm_head",  # the LM head's GEMMs in FP8 too (--fp8-lm-head: in the fused loss's chunks, or over full logits)
    "fused_loss",  # the LM head's loss chunked over tokens (fp8lab.train.fused_loss)
    "memory",  # bytes of state per parameter (fp8lab.plan.memory_modes); missing: plain
    "fp8_weights",  # an FP8 run's block weights: cast from bf16, or primary (only in FP8); missing: cast
    "task",  # what the run trained: pretrain (a record without it too), sft, sft-lora (labels.task_label)
    "peer",  # true: a peer's run (benchmarks/peers.py), not fp8lab's; shown beside it (fp8lab.analysis.peers)
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
OTHER_RECORDS = (FP8_STATS_RECORD,)  # records beside the steps (fp8lab.fp8.stats): not rows of the run table

# Other spellings of the metadata keys, as trainers, launchers and benchmarks write them.
_ALIASES = {
    "run_id": ("run_id", "run_name", "name", "job_name", "job"),
    "world_size": ("world_size", "num_gpus", "gpus"),
    "instances": ("instances", "instance_count", "num_nodes", "nnodes", "nodes"),
    "micro_batch_size": ("micro_batch_size", "batch_size", "per_device_batch_size", "micro_batch"),
    "grad_accum": ("grad_accum", "gradient_accumulation_steps", "grad_accum_steps"),
    "seq_len": ("seq_len", "seq_length", "max_seq_len", "block_size", "sequence_length"),
}


class RunFileError(ValueError):
    """A run file cannot be read; the message names the file and the line."""


class RunFileWarning(UserWarning):
    """A run file was read only in part (e.g. a run still in progress)."""


def load_runs(sources: object = None) -> pd.DataFrame:
    """Read runs into one table: a row per step (or per summary record) with the run's metadata.

    ``sources``: a path or a DataFrame, or a list of them. A path may be a trainer output folder
    (``metrics.jsonl`` + optional ``config.json``), a result file (``*.jsonl`` whose first line is a
    ``{"record": "run"}``), a bare ``metrics.jsonl``, or a folder searched recursively for both.
    A DataFrame (or a ``.csv`` file, as ``fp8lab launch collect --csv`` writes) is a
    ``fp8lab.launch.collect`` table (metrics columns plus ``job``/``job_name`` and ``instance_count``). ``None`` reads
    the committed results in ``data/results/``.
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
        return pd.DataFrame({c: pd.Series(dtype="object" if c in META_COLUMNS + ["record"] else "float64")
                             for c in COLUMNS})
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
    # any other .jsonl is a result file, unless it lives inside a trainer output folder
    results = [f for f in files if f.name != "metrics.jsonl" and not trainer_dirs.intersection(f.parents)]
    # each run's rows as dicts, one table and one pass of _finish for all (a frame per run was most of the time a
    # report of thousands of runs took); "_file" keeps each run's rows apart and in the order the files are read
    rows: list[dict] = []
    for i, s in enumerate(progress(sorted(trainer_dirs) + results, f"reading runs in {path.name or path}",
                                   total=len(trainer_dirs) + len(results), unit="run")):
        rows.extend({**r, _FILE: i} for r in (_trainer_rows(s) if s in trainer_dirs else _result_rows(s)))
    return [_finish(pd.DataFrame(rows))] if rows else []


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
            run = {k: v for k, v in one.iloc[0].to_dict().items()
                   if not (np.isscalar(v) and pd.isna(v))} if len(one) else {}
            run.setdefault("run_id", f.parent.name)
        if "categories_ms" not in prof:
            raise ValueError(f"{display_path(f)}: not a profile (no categories_ms)")
        meta = {"run_id": run.get("run_id", f.stem.replace(".profile", "")), "model": run.get("model"),
                "variant": run.get("variant") or variant_label(run), "precision": run.get("precision"),
                "layout": layout_label(run),
                "total_ms": prof.get("time_ms_per_step"), "step_ms": prof.get("unprofiled_step_ms"),
                "gpu_busy": prof.get("gpu_busy"), "source": display_path(f), "note": prof.get("note", "")}
        rows += [{**meta, "category": cat, "ms": ms} for cat, ms in prof["categories_ms"].items()]
    return pd.DataFrame(rows, columns=cols)


@functools.lru_cache(maxsize=16)
def _real(path: str) -> str:
    return os.path.realpath(path)


def display_path(path: Path) -> str:
    """A path as shown in tables: relative to the repository or the working folder, never absolute."""
    real = os.path.realpath(path)  # the bases resolved once, not per file of a folder of thousands
    for base in (_real(str(REPO_ROOT)), _real(os.getcwd())):
        if real == base:
            return "."
        if real.startswith(base.rstrip(os.sep) + os.sep):
            return Path(real[len(base.rstrip(os.sep)) + 1:]).as_posix()
    return "/".join(Path(real).parts[-2:])


def _read_regular(path: Path) -> str:
    """The text of a regular file; RunFileError for a FIFO, device or socket (never opened: a FIFO would block)."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise RunFileError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    if not stat.S_ISREG(st.st_mode):
        raise RunFileError(f"{path}: not a regular file (a FIFO, device or socket); allowed: result files and "
                           "trainer output folders")
    try:
        return read_result_text(path)
    except UnicodeDecodeError as exc:
        raise RunFileError(f"{path}: not UTF-8 text (byte {exc.start})") from None


# Fields of run, step and summary records with what they may hold (None/null: not logged). Checked per
# file as it is read, so no table, figure or report divides by a zero, an Infinity or a 1e30.
_SIZE_LIMITS = {"world_size": 10**6, "instances": 10**5, "micro_batch_size": 10**7, "grad_accum": 10**7,
                "seq_len": 10**8, "step": 10**12, "tokens": 10**18}
_POSITIVE_RATES = ("step_time_s", "tokens_per_sec", "tokens_per_sec_per_gpu")
_NONNEG_NUMBERS = ("mfu", "lr", "max_mem_gib")


def _field_problem(name: str, v: object) -> str | None:
    """What is allowed for field ``name`` when ``v`` is not, else None."""
    if v is None or isinstance(v, str) and name not in _SIZE_LIMITS:
        return None
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    if name in _SIZE_LIMITS:
        low = 0 if name == "tokens" else 1
        top = _SIZE_LIMITS[name]
        if not (num and math.isfinite(v) and float(v).is_integer() and low <= v <= top):
            return f"an integer from {low} to {top:.0e}"
    elif name in _POSITIVE_RATES:
        if not (num and math.isfinite(v) and v > 0):
            return "a finite number > 0, or null"
    elif name in _NONNEG_NUMBERS:
        if not (num and math.isfinite(v) and v >= 0):
            return "a finite number >= 0, or null"
    return None


# each field's plain case, tested first (a folder of thousands of runs has millions of fields): an int or float in range
_PLAIN = {**{n: (lambda v, top=top, low=0 if n == "tokens" else 1:
                 low <= v <= top and (type(v) is int or v.is_integer()))
             for n, top in _SIZE_LIMITS.items()},
          **{n: (lambda v: 0 < v < math.inf) for n in _POSITIVE_RATES},
          **{n: (lambda v: 0 <= v < math.inf) for n in _NONNEG_NUMBERS}}


def check_record_fields(path: Path, lineno: int | str, rec: dict) -> None:
    """RunFileError naming the file, line and field when a record's size or rate field is out of range."""
    for name, plain in _PLAIN.items():
        v = rec.get(name, _NA)
        if v is _NA or v is None or (type(v) in (int, float) and plain(v)):
            continue
        if name in rec:
            why = _field_problem(name, rec[name])
            if why:
                v = rec[name]
                shown = repr(v) if isinstance(v, (int, float, bool, type(None))) else type(v).__name__
                raise RunFileError(f"{path}: line {lineno}: field {name}={shown} is invalid; allowed: {why}")


def read_jsonl(path: str | Path) -> list[tuple[int, dict]]:
    """(line number, object) for each record; a truncated last line is dropped with a warning.

    A corrupt line anywhere else raises :class:`RunFileError` naming the file and line.
    """
    path = Path(path)
    text = _read_regular(path)
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
            # position, not content: the file may be anything (a symlink to a system file)
            raise RunFileError(f"{path}: line {i} is not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict):
            raise RunFileError(f"{path}: line {i} is not a JSON object (a {type(obj).__name__})")
        records.append((i, obj))
    return records


RUN_RECORD_REQUIRED = ("model", "precision", "gpu_name", "world_size", "command", "date")


def run_and_summary(path: str | Path) -> tuple[dict, dict]:
    """A result file's run record and its summary (``{}`` for one it lacks): what a study's check reads of a run."""
    recs = [r for _, r in read_jsonl(path)]
    return (next((r for r in recs if r.get("record") == "run"), {}),
            next((r for r in recs if r.get("record") == "summary"), {}))


def write_result_file(path: str | Path, run: dict, steps: Iterable[dict] = (), summary: dict | None = None,
                      others: Iterable[dict] = ()) -> Path:
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
    others = [dict(r) for r in others]
    bad = [r.get("record") for r in others if r.get("record") not in OTHER_RECORDS]
    if bad:
        raise ValueError(f"others: record type(s) {bad[:3]}; allowed: {', '.join(OTHER_RECORDS)}")
    lines += others
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
    # a trainer folder's config.json says --task and --lora-rank apart; a result file says the label itself; older
    # records say neither (pretraining)
    task = meta.get("task") if isinstance(meta.get("task"), str) and meta.get("task") else PRETRAIN
    rank = meta.get("lora_rank")
    meta["task"] = task if task.endswith(LORA_SUFFIX) else task_label(task, rank if isinstance(rank, int) else 0)
    return meta


_FILE = "_file"  # a folder's runs read together: which file (or trainer folder) a row came from, dropped by _finish
_NA = object()
_NAN = object()  # a NaN, as a key: NaN never equals itself


def _step_rows(path: Path, records: list[tuple[int, dict]], meta: dict) -> list[dict]:
    """A run's step records as rows: per-step values say what ran; the run's metadata fills what they leave out."""
    for lineno, rec in records:
        if "step" not in rec:
            raise RunFileError(f"{path}: line {lineno} has no 'step' key (keys: {', '.join(sorted(rec))[:120]})")
    fill = [(k, v) for k, v in meta.items() if k in META_COLUMNS]
    rows = []
    for _, rec in records:
        row = {k: v for k, v in rec.items() if k != "record"}
        # a NaN/Infinity written in the file (not a missing value): flagged, so it is never taken for "not logged"
        row["loss_nonfinite"] = _nonfinite(rec.get("loss")) or _nonfinite(rec.get("val_loss"))
        for k, v in fill:
            cur = row.get(k, _NA)
            if cur is _NA or cur is None or (isinstance(cur, float) and cur != cur):
                row[k] = v
        row["record"] = "step"
        rows.append(row)
    return rows


def _with_columns(df: pd.DataFrame, values: dict) -> pd.DataFrame:
    """``df`` with the columns ``values`` (name -> one value for every row) appended in their order, as
    ``df[name] = value`` one by one would (the same dtypes), in one step."""
    if not values:
        return df
    if not len(df) or not df.index.is_unique:  # the plain way where a frame-wide step would differ
        for k, v in values.items():
            df[k] = v
        return df
    added = pd.DataFrame({k: [v] * len(df) for k, v in values.items()}, index=df.index, columns=list(values))
    return pd.concat([df, added], axis=1)


def _nonfinite(v: object) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def _trainer_rows(folder: Path) -> list[dict]:
    """A trainer output folder's rows: its metrics.jsonl steps with its config.json's metadata."""
    meta: dict = {}
    cfg = folder / "config.json"
    if cfg.exists():
        try:
            meta = _meta(normalize_config(json.loads(_read_regular(cfg))))  # old folders' keys too
        except json.JSONDecodeError as exc:
            raise RunFileError(f"{cfg}: line {exc.lineno} is not valid JSON ({exc.msg})") from None
        except AttributeError:  # not a JSON object
            raise RunFileError(f"{cfg}: not a JSON object") from None
        check_record_fields(cfg, "-", meta)
    meta["run_id"] = folder.name
    meta.setdefault("study", folder.parent.name or "local")
    meta["source"] = display_path(folder)
    records = [(i, r) for i, r in read_jsonl(folder / "metrics.jsonl") if r.get("record") not in OTHER_RECORDS]
    for lineno, rec in records:
        check_record_fields(folder / "metrics.jsonl", lineno, rec)
    if not records:
        warnings.warn(f"{folder / 'metrics.jsonl'}: no complete records yet; run skipped", RunFileWarning, stacklevel=3)
        return []
    return _step_rows(folder / "metrics.jsonl", records, meta)


def _load_trainer_dir(folder: Path) -> pd.DataFrame:
    rows = _trainer_rows(folder)
    return _finish(pd.DataFrame(rows)) if rows else pd.DataFrame()


def _load_result_file(path: Path) -> pd.DataFrame:
    rows = _result_rows(path)
    return _finish(pd.DataFrame(rows)) if rows else pd.DataFrame()


def _result_rows(path: Path) -> list[dict]:
    """A result file's rows: its step records, then its last summary record (none: [] with a warning)."""
    records = read_jsonl(path)
    if not records:
        warnings.warn(f"{path}: empty result file; skipped", RunFileWarning, stacklevel=3)
        return []
    first_line, first = records[0]
    if first.get("record") != "run":
        raise RunFileError(
            f"{path}: line {first_line} must be the run record {{\"record\": \"run\", ...}}; "
            f"found record={first.get('record')!r} (see data/results/README.md)")
    meta = _meta(normalize_config({k: v for k, v in first.items() if k != "record"}))  # old records' keys too
    check_record_fields(path, first_line, meta)
    for lineno, rec in records[1:]:
        check_record_fields(path, lineno, rec)
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
        elif kind in OTHER_RECORDS:  # read by their own readers (fp8lab.analysis.fp8_stats.table)
            continue
        else:
            raise RunFileError(f"{path}: line {lineno} has record={kind!r}; allowed after line 1: 'step', 'summary'")
    rows = _step_rows(path, steps, meta) if steps else []
    if summaries:
        last = {k: v for k, v in summaries[-1][1].items() if k != "record" and not isinstance(v, (dict, list))}
        # the last summary wins (a rerun may append a newer one); the run record's metadata over it
        rows.append({**last, **{k: v for k, v in meta.items() if k in META_COLUMNS}, "record": "summary"})
    if not rows:
        warnings.warn(f"{path}: run record only, no step or summary records; skipped", RunFileWarning, stacklevel=3)
    return rows


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
    df = _with_columns(df, {c: np.nan for c in COLUMNS if c not in df})
    if "instances" in df:
        df["instances"] = df["instances"].fillna(1)
    for c in ("precision", "backend", "recipe"):
        df[c] = df[c].map(lambda v: v.lower() if isinstance(v, str) else v)
    df["backend"] = df["backend"].replace({"none": "hf"})  # the trainer's "none" = plain transformers layers
    for c in METRIC_COLUMNS + ["world_size", "instances", "micro_batch_size", "grad_accum", "seq_len"]:
        df[c] = pd.to_numeric(df[c], errors="coerce")
    steps = df[df["record"] == "step"]
    per = [_FILE] if _FILE in df else []  # several files read together: each file's runs on their own
    if len(steps) and steps.duplicated(per + ["run_id", "step"]).any():
        # a validation record may come as its own line for the same step: merge, first non-null wins
        merged = steps.groupby(per + ["run_id", "step"], sort=False, as_index=False).first()
        df = pd.concat([merged, df[df["record"] != "step"]], ignore_index=True, sort=False)
    df["variant"] = _variants(df)
    df = df.sort_values(per + ["run_id", "record", "step"], na_position="last", kind="stable")
    return df.drop(columns=per) if per else df


def _variants(df: pd.DataFrame) -> list[str]:
    """:func:`variant_label` of each row, computed once per distinct set of the values it reads
    (:data:`VARIANT_KEYS`; a run's steps share them), not once per step."""
    keys = [k for k in VARIANT_KEYS if k in df]
    cols = [df[k].tolist() for k in keys]
    # built a column at a time (a folder of thousands of runs has ~10^5 rows): each value with its type, NaN as one
    # marker that equals itself, so equal rows find their label with one look-up
    marked = [[_NAN if type(v) is float and v != v else v for v in c] for c in cols]
    types = [list(map(type, c)) for c in cols]
    seen: dict = {}
    out = []
    for values, key in zip(zip(*cols), zip(zip(*types), zip(*marked))):
        label = seen.get(key)
        if label is None:
            label = seen[key] = variant_label(dict(zip(keys, values)))
        out.append(label)
    return out


def _unique_run_ids(df: pd.DataFrame) -> pd.Series:
    """Run ids made unique across sources (two folders both named 'bf16' stay apart)."""
    ids = df["run_id"].astype(str)
    per_id = df.groupby(ids)["source"].nunique()
    clash = set(per_id[per_id > 1].index)
    if not clash:
        return ids
    return pd.Series([f"{i} ({s})" if i in clash else i for i, s in zip(ids, df["source"])], index=df.index)


def load_reference(path: str | Path | None = None) -> pd.DataFrame:
    """The source blog's headline figures (reported by the source, not measured here)."""
    path = Path(path) if path else DATA_DIR / "reference" / "source_blog.json"
    ref = json.loads(Path(path).read_text(encoding="utf-8"))
    df = pd.DataFrame(ref["results"]).drop(columns=["approximate"], errors="ignore")
    df["label"] = ref["label"]
    df["hardware"] = ref["hardware"]
    df["tokens"] = float(ref["tokens"])
    return df


def source_link(path: str | Path | None = None) -> str:
    """The source blog as a Markdown link: its title (as published, in quotes) to its address, and where it appeared."""
    path = Path(path) if path else DATA_DIR / "reference" / "source_blog.json"
    ref = json.loads(Path(path).read_text(encoding="utf-8"))
    return f"{ref['venue']}, [\u201c{ref['title']}\u201d]({ref['url']}) ({ref['date']})"


def reference_for(reference: pd.DataFrame | None, model: str) -> pd.DataFrame:
    """The source's reported rows for a model of this size (by the size in its name; none: empty)."""
    if reference is None or not len(reference):
        return pd.DataFrame()
    return reference[np.isclose(reference["params_b"], model_size_b(model))]


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
                raise ValueError(f"{col}s={list(wanted)!r}: no runs of {', '.join(unknown)}; there are: "
                                 f"{', '.join(there)}")
            out = out[out[col].isin(wanted)]
    if variant:
        out = out[out["variant"].astype(str).str.contains(variant, regex=False)]
        if not len(out):
            raise ValueError(f"variant={variant!r}: no run's variant contains it; variants: "
                             f"{', '.join(sorted(map(str, runs['variant'].dropna().unique())))}")
    return out
