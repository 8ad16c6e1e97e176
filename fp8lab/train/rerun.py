"""A run started in a folder that already holds one: it resumes that run, keeps it as it is, or is refused, before
anything is tokenized, built or written there (rank 0, under the folders' run locks).

* :func:`refuse_replacing`: a run that would start afresh (``--resume False``, or nothing to resume) where a
  completed run's summary is, or where a run stopped early (its steps in metrics.jsonl, no checkpoint: e.g. under
  ``--checkpoint-every -1``), is refused; only ``--resume False`` starts a stopped run over, and nothing replaces a
  completed one;
* :func:`resumed_checkpoint`: a run resuming a checkpoint (``--resume True``) is that checkpoint's run: its options
  are compared with the checkpoint's fingerprint (fp8lab.train.resume) from its trainer state alone, no weights
  read, and another model is said as such, not as weights that fail to load. The data's identity is compared once
  the run's tokens exist (the trainer's ``_check_tokens``), before they replace the run folder's;
* :func:`unsaved_stop` and :func:`eval_failed`: what a run that ends without a checkpoint or a validation loss says
  a restart does.
"""
from __future__ import annotations

import json
from typing import Any

from fp8lab.records import metrics as fmetrics
from fp8lab.records import ownership
from fp8lab.train import checkpoint as fckpt
from fp8lab.train import resume as fresume

START_OVER = "--resume False in this --output-dir (replacing them), or another --output-dir"


def refuse_replacing(c, paths) -> None:
    """ValueError where this run (TrainConfig ``c``, its RunPaths ``paths``) would start afresh over an ended run."""
    out = paths.output_dir
    resumable = fckpt.complete_checkpoints(paths.checkpoint_dir)
    if c.resume and resumable:
        return  # it resumes (or keeps a finished run as it is: the trainer's finish)
    if ownership.foreign(out, "run"):
        return  # not fp8lab's files: check_run_folders refused the folder
    summary = out / "summary.json"
    try:  # a regular file only (a FIFO would wait for a writer; check_run_folders refused one already)
        ended = json.loads(summary.read_text()).get("status") if summary.is_file() else None
    except (OSError, ValueError, AttributeError):
        ended = None
    if ended == "completed":
        why = "with --resume False" if not c.resume else "with no checkpoint to resume from"
        resume = " or the same command with --resume True and its checkpoints" if resumable else ""
        raise ValueError(f"--output-dir={str(out)!r} holds a completed run (its metrics.jsonl, summary.json"
                         f"{' and model' if (paths.model_dir / 'config.json').is_file() else ''}); starting "
                         f"afresh {why} would replace them; allowed: a new --output-dir{resume and ','}{resume}")
    steps = [r["step"] for r in fmetrics.read_metrics(out / "metrics.jsonl")] if c.resume and (
        out / "metrics.jsonl").is_file() else []
    if steps:
        kept = ", ".join(n for n in ("summary.json", "loss.png") if (out / n).is_file())
        raise ValueError(f"--output-dir={str(out)!r} holds a run stopped at step {max(steps)} (its metrics.jsonl"
                         f"{', ' + kept if kept else ''}) and no checkpoint to resume from in --checkpoint-dir "
                         f"{str(paths.checkpoint_dir)!r}; starting afresh would replace them; allowed: "
                         "another --output-dir, or --resume False to start over in this one")


def resumed_checkpoint(c, paths, plan) -> tuple[dict[str, Any], str, int] | None:
    """(fingerprint, folder, step) of the checkpoint this run resumes, its options checked against it (ValueError:
    another model, or changed settings); None where it resumes none. The newest checkpoint whose trainer state reads
    is the one Checkpointer.resume loads, and checks again, unless its weights fail to load."""
    if not c.resume:
        return None
    for step, path in fckpt.complete_checkpoints(paths.checkpoint_dir):
        try:
            state = fckpt.read_trainer_state(path)
            saved, where = state["fingerprint"], str(path)
            step = state.get("train_state", state).get("step", step)
        except Exception:  # noqa: BLE001  (torch's unpickling errors have no common base) Checkpointer.resume
            continue  # reports it and tries an older one: so does this check
        current = fresume.fingerprint(plan)  # no "data" yet: differences() compares the keys both have
        if "model" in fresume.differences(saved, current):
            raise ValueError(another_model(c, paths, saved, current, state.get("config") or {}))
        fresume.check(saved, current, where, step, c.resume_with_new_settings)
        return saved, where, step
    return None


def another_model(c, paths, saved: dict[str, Any], current: dict[str, Any], config: dict[str, Any]) -> str:
    """The refusal of a re-run with another --model than its checkpoint's (fingerprints ``saved`` and ``current``)."""
    there, here = str(config.get("model", saved["model"])), c.model
    if there == here:  # the same name, another config.json: the identities tell them apart
        there, here = f"{there} ({saved['model']})", f"{here} ({current['model']})"
    inside = paths.output_dir.resolve() in paths.checkpoint_dir.resolve().parents
    option, folder = ("--output-dir", paths.output_dir) if inside else ("--checkpoint-dir", paths.checkpoint_dir)
    return (f"{option}={str(folder)!r} holds a run of another model (model: {there!r} there, {here!r} here); "
            f"allowed: the same --model to resume, or another {option}")


def unsaved_stop(signal_name: str, step: int, c, paths, is_main: bool) -> str:
    """The stop message of a signal under ``--checkpoint-every -1``: no checkpoint was written, so a restart resumes
    from an older one if the checkpoint folder holds one, else starts over (:func:`refuse_replacing` lets only
    ``--resume False`` do that where a stopped run's metrics are)."""
    done = [s for s, _ in fckpt.complete_checkpoints(paths.checkpoint_dir)] if is_main else []
    head = (f"fp8lab: {signal_name} received: stopped at step {step}; no checkpoint written (--checkpoint-every "
            "-1); metrics.jsonl and summary.json are kept")
    if c.resume and done:
        return f"{head}; a restart resumes from checkpoint step_{done[0]:08d} (step {done[0]})"
    return f"{head}; a restart starts over from step 1: {START_OVER}"


def eval_failed(error: str, c, checkpoints: bool) -> str:
    """The end message of a run whose final evaluation failed (``checkpoints``: it wrote them): the training is kept,
    and the same command evaluates again from the last checkpoint; without one only training again can."""
    exported = " and the exported model are" if c.save_model else " is"
    if checkpoints:
        return (f"fp8lab: the final evaluation failed ({error}); the training is kept: the last checkpoint{exported} "
                "written, summary.json has no val_loss. Re-running the same command evaluates again without training "
                "(e.g. with a smaller --val-batches)")
    # the same command is refused then (refuse_replacing): a stopped run's metrics, nothing to resume
    return (f"fp8lab: the final evaluation failed ({error}); summary.json has no val_loss"
            f"{' (the model is exported)' if c.save_model else ''}; no checkpoint was written (--checkpoint-every -1), "
            f"so evaluating again means training again: {START_OVER}")
