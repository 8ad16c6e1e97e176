"""Replaying a run from its record: ``fp8lab train --config <run>/config.json`` (and notebook 03's ``config``).

A run's config.json keeps what it was asked (``requested``: every option, "auto" included, written by
``fp8lab.train.run_record.config_record``); planning those options again on the same kind of machine gives the same
``RunPlan``. What is replayed: every trainer option of the record but where this run writes and whether it trains
(:data:`NOT_REPLAYED`); options given explicitly win over the record's. A record of an older fp8lab without
``requested`` is replayed from its flat option keys. A path the record could not keep (written ``<abs>/<name>``,
outside the run's folder) must be given again; the error names the flag. The new run's config.json says it was
replayed (``replayed_from``: the record's path relative to the new run's folder, its SHA-256 and its command).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from fp8lab.core.paths import ABSOLUTE_PLACEHOLDER
from fp8lab.plan.config import TrainConfig
from fp8lab.plan.options import flag

# fp8lab train's flag (not a TrainConfig field: no plan decision)
CONFIG_FLAG, CONFIG_DEST = "--config", "replay_config"
# this run's own: where it writes (the record's run folder is not overwritten) and whether it trains at all
NOT_REPLAYED = ("output_dir", "checkpoint_dir", "model_dir", "dry_run")
PATH_OPTIONS = ("model", "data")  # options whose values may be paths written relative to the record's run folder


def read_record(path: str | Path) -> dict[str, Any]:
    """A run's config.json, checked: an error names ``--config`` and what was wrong."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        record = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"--config {path}: no such file; allowed: a run's config.json (or its run folder)") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"--config {path}: not a readable JSON file ({type(exc).__name__}); allowed: a run's "
                         "config.json as fp8lab train writes it") from None
    if not isinstance(record, dict) or not isinstance(record.get("requested", record.get("model")), (dict, str)):
        raise ValueError(f"--config {path}: not a run's config.json (no 'requested' options); allowed: a run's "
                         "config.json as fp8lab train writes it")
    return record


def replayed_options(path: str | Path, explicit: dict[str, Any] | None = None) -> dict[str, Any]:
    """TrainConfig keyword arguments of the run recorded at ``path``, with ``explicit`` ones winning."""
    explicit = dict(explicit or {})
    record = read_record(path)
    asked = record["requested"] if isinstance(record.get("requested"), dict) else record
    folder = (Path(path) if Path(path).is_dir() else Path(path).parent)
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    out: dict[str, Any] = {}
    for name, value in asked.items():
        if name not in fields or name in NOT_REPLAYED or name in explicit:
            continue
        if isinstance(value, str) and value.startswith(ABSOLUTE_PLACEHOLDER):
            raise ValueError(f"--config {path}: the record keeps {name} only as {value!r} (a path outside its run "
                             f"folder); pass {flag(name)} as well")
        if (name in PATH_OPTIONS and isinstance(value, str) and not Path(value).is_absolute()
                and not Path(value).exists()):
            # written relative to the run's folder, or as typed where the run started (one of its folder's parents)
            value = next((str(base / value) for base in (folder, *folder.resolve().parents) if (base / value).exists()),
                         value)
        out[name] = tuple(value) if isinstance(value, list) else value
    return {**out, **explicit}


def config_of(path: str | Path, **explicit: Any) -> TrainConfig:
    """The TrainConfig that replays the run recorded at ``path`` (``explicit`` options win)."""
    return TrainConfig(**replayed_options(path, explicit))


def replayed_from(path: str | Path | None, output_dir: Path) -> dict[str, Any] | None:
    """What the new run's config.json says about the record it replays (None: not a replay)."""
    if path is None:
        return None
    p = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    record = read_record(p)
    # relative to the new run's folder: where the record sits beside it, without this machine's folders
    return {"config": os.path.relpath(p.resolve(), Path(output_dir).resolve()),
            "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "command": record.get("command")}
