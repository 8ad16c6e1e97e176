"""Train one model in BF16 or FP8 on real text: a CPU, one GPU, torchrun (DDP / FSDP2) or SageMaker.

The same file runs everywhere; only the launch differs::

    # CPU, seconds: tiny Llama, FP8 emulated in PyTorch (only the loss comparison means anything)
    python -m fp8lab.train --model llama-tiny --precision fp8 --backend emulated --steps 50

    # one H100/H200: llama-1b, BF16 then FP8 with Transformer Engine, same data order
    fp8lab train --model llama-1b --precision bf16 --backend te --steps 300 --seq-len 2048 --output-dir runs/1b-bf16
    fp8lab train --model llama-1b --precision fp8  --backend te --steps 300 --seq-len 2048 --output-dir runs/1b-fp8

    # your own Llama / GPT-Neo folder (config.json + optional *.safetensors) or hf:<repo id>;
    # exported back to its own class and tokenizer in <output-dir>/model (docs/own-model.md)
    fp8lab train --model path/to/my-llama --precision fp8 --backend te --steps 300

    # 8 GPUs of one node, FSDP2 (fully_shard per decoder block)
    torchrun --nproc-per-node 8 -m fp8lab.train --model llama-7b --precision fp8 --parallel fsdp ...

    # SageMaker: fp8lab.launch passes the same options as hyperparameters; data comes from
    # SM_CHANNEL_TRAIN, the model goes to SM_MODEL_DIR, metrics + plots to SM_OUTPUT_DATA_DIR,
    # checkpoints to /opt/ml/checkpoints (synced to S3; a restarted spot job resumes from them)

This module holds the entry points; ``TrainConfig`` (fp8lab.plan.config, importable from here; each option declared once
on its field: fp8lab.plan.options): what was requested, "auto" included. ``fp8lab.plan.runplan.plan_run`` decides what
runs (backend, recipe, layout, steps, graphs, ...); the run itself, its set-up order and its loop, is
``fp8lab.train.trainer.Trainer``, which builds from that plan.

``precision`` and ``backend``: ``--precision fp8`` runs the converted model inside FP8 autocast.
``--precision bf16`` with an explicit ``--backend`` runs the *same converted layers* with FP8 off
(TE BF16 vs TE FP8, what SageMaker jobs of fp8lab.launch compare); with ``--backend auto`` (the
default) a BF16 run does the same where Transformer Engine is usable, and elsewhere runs the plain
Hugging Face model (which ``--backend none`` always runs). Non-FP8 math runs under ``torch.autocast``
in ``--compute-dtype`` (default bf16 on GPUs, fp32 on CPUs, where bf16 autocast is slow and
adds nothing to a loss comparison) over float32 parameters. ``--param-dtype bf16`` keeps the
parameters (and gradients) in bf16 instead, so nothing is re-cast per step, and the optimizer
steps fp32 master copies (fp8lab.train.master_weights); under FSDP2 the shards stay fp32 and are
gathered as bf16. The model then computes in bf16 whatever ``--compute-dtype`` says.

Outputs in ``--output-dir``: ``metrics.jsonl`` (one record per step), ``config.json`` (options +
provenance), ``summary.json``, ``loss.png``, ``checkpoints/`` and ``model/`` (HF ``save_pretrained``
plus the tokenizer) unless SageMaker or the options place them elsewhere.

Exit codes of ``main``: 0 done (or stopped by SIGTERM or Ctrl-C after a checkpoint), 2 bad options,
3 stopped by the FP8 overflow guard (too many non-finite steps in a row), 4 stopped because a
checkpoint could not be written (metrics.jsonl and summary.json are still written), or the final
model export or summary.json could not be written (the weights then kept in a checkpoint), or another
write failed (a full disk, a file-size limit: one line naming the file); 130 stopped at once by a second
Ctrl-C or one outside the training loop (the newest checkpoint kept: the same command resumes from it).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
from typing import Any

from fp8lab.core import validate as fvalidate
from fp8lab.core.paths import shareable_path
from fp8lab.core.errors import OptionError, RefusedOnRankZero
from fp8lab.plan.options import (BACKENDS, COMPUTE_DTYPES, CUDA_GRAPHS, DEVICES, EMULATED, FP8_BACKENDS,  # noqa: F401
                            PARALLEL, PARAM_DTYPES, PRECISIONS, PROGRESS, RECIPES, AutoBool, AutoInt, Steps,
                            STUDY, add_arguments, check_fields, check_schema, flag, from_text, option, section_of,
                            to_text)
from fp8lab.train import replay
from fp8lab.train.run_paths import resolve_paths

EXIT_BAD_OPTIONS, EXIT_OVERFLOW, EXIT_CHECKPOINT_FAILED = 2, 3, 4
EXIT_EVAL_FAILED = 5  # trained, checkpointed and exported; only the final validation loss is missing
# stopped at once by Ctrl-C (a second one, or one outside the training loop): the shell's 128 + SIGINT
EXIT_INTERRUPTED = 130
# TrainConfig and its checks live in fp8lab.plan.config; their names stay importable from here
from fp8lab.plan.config import CHECKPOINT_EVERY, TrainConfig, option_problem  # noqa: E402,F401


# ----------------------------------------------------------------------------------------------
# command line (and SageMaker hyperparameters, which arrive as --key value strings)
# ----------------------------------------------------------------------------------------------



class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line instead of usage + exit inside a library call
        study = [flag(f.name) for f in dataclasses.fields(TrainConfig) if section_of(f) == STUDY]
        if "unrecognized arguments" in message and any(s in message for s in study):
            message += f" ({', '.join(study)} are study and test switches: pass {STUDY_FLAG} to use them)"
        raise ValueError(message)


STUDY_FLAG = "--study"  # accepts (and lists in --help) the study and test switches: fp8lab.plan.options.STUDY


def build_parser(study: bool = False) -> argparse.ArgumentParser:
    """``fp8lab train``'s parser: the options by section; ``study``: the study and test switches too."""
    p = _Parser(prog="fp8lab train", usage="fp8lab train [--OPTION VALUE ...]", description=__doc__.splitlines()[0],
                allow_abbrev=False,
                epilog="Booleans accept True/False (SageMaker passes hyperparameters as strings); "
                       "every option also has an underscore spelling (--micro_batch_size). 'auto' is decided for "
                       "the machine: the run's first lines say what and why.")
    p.add_argument(STUDY_FLAG, nargs="?", const="True", default=None, metavar="TRUE",
                   help="also accept (and list) the study and test switches")
    add_arguments(p, TrainConfig, study=study)
    p.add_argument(replay.CONFIG_FLAG, dest=replay.CONFIG_DEST, metavar="RUN/config.json",
                   help="replay a run: its recorded options plan the same run again; flags given here win")
    return p


def _study(argv: list[str]) -> bool:
    """Whether ``argv`` asks for the study switches (``--study``, ``--study True``)."""
    yes = ("true", "1", "yes", "on")
    words = [str(w) for w in argv]
    for i, w in enumerate(words):
        if w == STUDY_FLAG:
            nxt = words[i + 1] if i + 1 < len(words) else ""
            return nxt.startswith("--") or nxt == "" or nxt.lower() in yes
        if w.startswith(STUDY_FLAG + "="):
            return w.partition("=")[2].lower() in yes
    return False


def parse_args(argv: list[str]) -> TrainConfig:
    """TrainConfig from CLI-style arguments; every value is converted and checked with a clear message."""
    return parse_command(argv)[0]


def parse_command(argv: list[str]) -> tuple[TrainConfig, str | None]:
    """(TrainConfig, the config.json it replays or None) from CLI-style arguments (:func:`parse_args`)."""
    args = vars(build_parser(_study(argv)).parse_args(argv))
    args.pop("study")
    source = args.pop(replay.CONFIG_DEST, None)
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    kwargs = {name: from_text(fields[name], raw) for name, raw in args.items() if raw is not None}
    if source is not None:
        kwargs = replay.replayed_options(source, kwargs)
    config = TrainConfig(**kwargs)
    fvalidate.check_cli_recipe(config, "recipe" in kwargs)
    fvalidate.check_cli_fp8_stats(config, "fp8_stats_every" in kwargs)
    return config, source


def _sagemaker_argv() -> list[str]:
    """Hyperparameters from SM_HPS (JSON) when the job passed none on the command line."""
    raw = os.environ.get("SM_HPS")
    if not raw:
        return []
    try:
        hps = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"SM_HPS (the job's hyperparameters) is not valid JSON ({getattr(exc, 'msg', exc)}); allowed: "
                         "a JSON object of option -> value, as SageMaker sets it") from None
    if not isinstance(hps, dict):
        raise ValueError(f"SM_HPS (the job's hyperparameters) is a JSON {type(hps).__name__}; allowed: a JSON object "
                         "of option -> value, as SageMaker sets it")
    return [w for k, v in hps.items() if not str(k).startswith("sagemaker_") for w in (f"--{k}", to_text(v))]



# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------

def train(config: TrainConfig | None = None, *, argv: list[str] | None = None,
          planned: dict[str, Any] | None = None, replayed_from: str | None = None) -> dict[str, Any]:
    """Run one training job as configured; returns the summary (also written to summary.json).

    ``planned``: the decisions of the plan made for this run elsewhere (a SageMaker job's, at launch:
    ``RunPlan.decisions()``); the run is refused when this machine plans it differently. ``replayed_from``: the
    config.json ``config`` was replayed from (fp8lab.train.replay.config_of), recorded in this run's config.json."""
    from fp8lab.train import distributed as fdist  # torch: loads when a run starts (fp8lab train --help stays light)

    c = config or TrainConfig()
    try:
        env = fdist.setup(c.device)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    try:
        from fp8lab.train.trainer import run  # the Trainer (torch, as above): setup, fit, finish

        return run(c, env, argv, expected=planned, replayed_from=replayed_from)
    finally:
        fdist.teardown(env)


def where_it_writes(config) -> str:
    """The line ``fp8lab train`` starts with: the folders it writes and what goes in them."""
    p = resolve_paths(config)
    model = f", the model in {p.model_dir}/" if config.save_model else ""
    return (f"fp8lab train: writes to {p.output_dir}/ (metrics.jsonl, config.json, summary.json, loss.png), "
            f"checkpoints to {p.checkpoint_dir}/{model}")


def write_failure(exc: OSError, config) -> str:
    """One line for an OSError: what it is and the file it concerns, that file relative to the run's folder."""
    name = shareable_path(str(exc.filename), resolve_paths(config).output_dir) if exc.filename else None
    what = exc.strerror or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {what}" + (f" ({name})" if name else "")


def _kept(config) -> str:
    """What an interrupted or failed run leaves: its newest complete checkpoint, which the same command resumes from."""
    from fp8lab.records import metrics as fmetrics  # (with the line below: only a stopped run needs them)
    from fp8lab.train import checkpoint as fckpt, rerun  # torch: loaded already when a run was under way

    p = resolve_paths(config)
    done = ([s for s, _ in fckpt.complete_checkpoints(p.checkpoint_dir)]
            if config.resume or config.checkpoint_every >= 0 else [])
    if not done:
        # steps in metrics.jsonl and nothing to resume: the same command is refused (rerun.refuse_replacing)
        if config.resume and (p.output_dir / "metrics.jsonl").is_file() and fmetrics.read_metrics(
                p.output_dir / "metrics.jsonl"):
            return ("the files written so far are kept; no checkpoint is complete, so a restart starts over: "
                    + rerun.START_OVER)
        return "the files written so far are kept; no checkpoint is complete, so the same command starts again"
    return (f"the files written so far and checkpoint step_{done[0]:08d} are kept: the same command resumes from "
            f"step {done[0]}")


def main(argv: list[str] | None = None, *, planned: dict[str, Any] | None = None) -> int:
    """``fp8lab train`` / ``python -m fp8lab.train``: 0 done, 2 bad options, 3 overflow guard stop, 4 a checkpoint,
    export or summary not written, 5 trained and exported but the final evaluation failed.

    ``planned``: as for :func:`train` (fp8lab.train.sm_entry passes a SageMaker job's plan)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        build_parser(_study(argv)).print_help()
        return 0
    try:
        if not argv and os.environ.get("SM_HPS"):
            argv = _sagemaker_argv()
        config, source = parse_command(argv)
    except ValueError as exc:
        print(f"fp8lab train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    if not config.dry_run and os.environ.get("RANK", "0") == "0":
        print(where_it_writes(config), flush=True)
    try:
        summary = train(config, argv=argv, planned=planned, replayed_from=source)
    except OptionError as exc:  # environment checks (device, backend, data, resume) before training
        if not isinstance(exc, RefusedOnRankZero):  # (said once, by rank 0)
            print(f"fp8lab train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    except KeyboardInterrupt as exc:  # a second Ctrl-C in a step, or Ctrl-C or SIGTERM in the export: stopped at once
        sig = str(exc.args[0]) if exc.args and str(exc.args[0]).startswith("SIG") else None
        print(f"fp8lab train: interrupted ({sig or 'Ctrl-C'}); {_kept(config)}", file=sys.stderr, flush=True)
        return 128 + signal.Signals[sig] if sig else EXIT_INTERRUPTED
    except OSError as exc:  # a write the run could not make (full disk, file-size limit) outside its own handling
        print(f"fp8lab train: error: {write_failure(exc, config)}; stopped; {_kept(config)}", file=sys.stderr,
              flush=True)
        return EXIT_CHECKPOINT_FAILED
    return {"stopped_nonfinite": EXIT_OVERFLOW, "checkpoint_failed": EXIT_CHECKPOINT_FAILED,
            "export_failed": EXIT_CHECKPOINT_FAILED,
            "summary_failed": EXIT_CHECKPOINT_FAILED, "eval_failed": EXIT_EVAL_FAILED}.get(summary["status"], 0)


if __name__ == "__main__":
    raise SystemExit(main())
