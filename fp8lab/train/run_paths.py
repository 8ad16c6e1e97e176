"""Where a run's files go: its output, checkpoint and model folders, SageMaker's when inside a job;
and, before anything is computed, that they can be written and the data read (``check_run``)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from fp8lab.data import run_data
from fp8lab.records.data_format import tokenized_here
from fp8lab.core.hardware import SAGEMAKER_CHECKPOINT_DIR
from fp8lab.core.probes import check_writable_dir
from fp8lab.model.models import MODEL_CONFIGS

CHECKPOINT_DIR_ENV = "FP8LAB_CHECKPOINT_DIR"  # overrides the checkpoint folder (tests, other platforms)


@dataclass(frozen=True)
class RunPaths:
    output_dir: Path
    checkpoint_dir: Path
    model_dir: Path
    data_cache: Path  # where text sources are tokenized when --data is not prepared already


def on_sagemaker() -> bool:
    return bool(os.environ.get("SM_MODEL_DIR") or os.environ.get("SM_TRAINING_ENV"))


def _run_name(model: str) -> str:
    """A folder name for the model: the named shape, a folder's own name, or the hub repo id."""
    if model in MODEL_CONFIGS:
        return model
    name = model[3:] if model.startswith("hf:") else Path(model).resolve().name
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name).strip(".-") or "model"


def resolve_paths(c) -> RunPaths:
    """Output, checkpoint and model folders for the run of TrainConfig ``c`` (SageMaker's when inside a job)."""
    sm = on_sagemaker()
    if c.output_dir is not None:
        out = Path(c.output_dir)
    elif sm and os.environ.get("SM_OUTPUT_DATA_DIR"):
        out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    else:
        out = Path("runs") / f"{_run_name(c.model)}-{c.precision}"
    if c.checkpoint_dir is not None:
        ck = Path(c.checkpoint_dir)
    elif os.environ.get(CHECKPOINT_DIR_ENV):
        ck = Path(os.environ[CHECKPOINT_DIR_ENV])
    elif sm:
        ck = Path(SAGEMAKER_CHECKPOINT_DIR)
    else:
        ck = out / "checkpoints"
    if c.model_dir is not None:
        md = Path(c.model_dir)
    elif sm and os.environ.get("SM_MODEL_DIR"):
        md = Path(os.environ["SM_MODEL_DIR"])
    else:
        md = out / "model"
    # text tokenized on the fly goes next to the run, except on SageMaker where the output folder is
    # uploaded as the job's output: there it stays on the instance's scratch disk
    cache = Path(tempfile.gettempdir()) / "fp8lab-tokens" if sm else out / "data"
    return RunPaths(out, ck, md, cache)


def data_source(c) -> str | None:
    return c.data if c.data is not None else os.environ.get("SM_CHANNEL_TRAIN")


def check_run(c, paths, source: str | None, scan_tokens: bool = True) -> None:
    """Before a training run computes, tokenizes or writes anything: its folders and its data (fp8lab.train.trainer.run;
    ``scan_tokens``: also every token id of a prepared --data, which a job reads once: trainer.scan_data_once)."""
    check_writable_dir("--output-dir", paths.output_dir)
    if c.checkpoint_every >= 0:
        check_writable_dir("--checkpoint-dir", paths.checkpoint_dir)
    elif paths.checkpoint_dir.exists() and not paths.checkpoint_dir.is_dir():
        raise ValueError(f"--checkpoint-dir={str(paths.checkpoint_dir)!r} is a file, not a folder")
    if c.save_model:
        check_writable_dir("--model-dir", paths.model_dir)
    # the data for --task, and the model folder's own tokenizer where it tokenizes them (loads, fits the model)
    run_data.check_source(source, c.task, c.model, c.model_config.vocab_size, scan_tokens=scan_tokens)
    if tokenized_here(source):
        check_writable_dir("--output-dir", paths.data_cache)  # text is tokenized there
