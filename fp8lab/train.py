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

This module holds the entry points and ``TrainConfig`` (each option declared once on its field:
fp8lab.options); the run itself, its set-up order and its loop, is ``fp8lab.trainer.Trainer``.

``precision`` and ``backend``: ``--precision fp8`` runs the converted model inside FP8 autocast.
``--precision bf16`` with an explicit ``--backend`` runs the *same converted layers* with FP8 off
(TE BF16 vs TE FP8, what SageMaker jobs of fp8lab.launch compare); with ``--backend auto`` (the
default) a BF16 run does the same where Transformer Engine is usable, and elsewhere runs the plain
Hugging Face model (which ``--backend none`` always runs). Non-FP8 math runs under ``torch.autocast``
in ``--compute-dtype`` (default bf16 on GPUs, fp32 on CPUs, where bf16 autocast is slow and
adds nothing to a loss comparison) over float32 parameters. ``--param-dtype bf16`` keeps the
parameters (and gradients) in bf16 instead, so nothing is re-cast per step, and the optimizer
steps fp32 master copies (fp8lab.master_weights); under FSDP2 the shards stay fp32 and are
gathered as bf16. The model then computes in bf16 whatever ``--compute-dtype`` says.

Outputs in ``--output-dir``: ``metrics.jsonl`` (one record per step), ``config.json`` (options +
provenance), ``summary.json``, ``loss.png``, ``checkpoints/`` and ``model/`` (HF ``save_pretrained``
plus the tokenizer) unless SageMaker or the options place them elsewhere.

Exit codes of ``main``: 0 done (or stopped by SIGTERM after a checkpoint), 2 bad options,
3 stopped by the FP8 overflow guard (too many non-finite steps in a row), 4 stopped because a
checkpoint could not be written (metrics.jsonl and summary.json are still written).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from fp8lab import data as fdata
from fp8lab import validate as fvalidate
from fp8lab.hardware import SAGEMAKER_CHECKPOINT_DIR
from fp8lab.options import (BACKENDS, COMPUTE_DTYPES, CUDA_GRAPHS, DEVICES, EMULATED, FP8_BACKENDS,  # noqa: F401
                            PARALLEL, PARAM_DTYPES, PRECISIONS, PROGRESS, RECIPES, AutoBool, AutoInt, Steps,
                            add_arguments, check_fields, check_schema, flag, from_text, option, to_text)
from fp8lab.recipe import KINDS, SETTINGS, Recipe
from fp8lab.validate import (AUTO, AUTO_BOOL, AUTO_OR_POSITIVE_INT, BOOL, NONNEG_INT, NONNEG_NUM, PATH, POSITIVE_INT,
                             STEP_COUNT, TOKEN_COUNT, UNIT_HALF_OPEN, UNIT_OPEN, Check, is_count, is_int, is_num, optional, step_numbers)

CHECKPOINT_EVERY = Check(lambda v: is_count(v, -1), "an integer: N > 0 steps, 0 = only at the end, -1 = never")
CHECKPOINT_DIR_ENV = "FP8LAB_CHECKPOINT_DIR"  # overrides the checkpoint folder (tests, other platforms)
EXIT_BAD_OPTIONS, EXIT_OVERFLOW, EXIT_CHECKPOINT_FAILED = 2, 3, 4
_opt = flag  # --seq-len for seq_len (the old name of fp8lab.options.flag)


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run; CLI flags and SageMaker hyperparameters have the same names.

    Each field is the option's one declaration (fp8lab.options): its help, choices or check, and,
    from its type, how its text is read. Validated on construction: a bad value raises ValueError
    naming the option (``--seq-len``) and what is allowed, before anything is built or downloaded.
    """

    model: str = option("llama-tiny", "fp8lab.models name (llama-tiny/1b/7b, gptneo-tiny/125m/1.3b), a model folder (config.json + optional *.safetensors) or hf:<repo id>")
    model_overrides: dict = option(help="ModelConfig field, e.g. num_layers=2 (repeat, or comma-separate)", factory=dict,
                                   metavar="KEY=VALUE", flags=("--model-override", "--model_override"))
    precision: str = option("bf16", "bf16 | fp8", choices=PRECISIONS)
    backend: str = option("auto", "auto (fp8: te on an FP8 GPU else emulated; bf16: plain HF) | none | " + " | ".join(FP8_BACKENDS), choices=BACKENDS)
    recipe: str = option("auto", "auto (backend default: TE delayed scaling) | " + " | ".join(KINDS) + ", optionally kind:key=value,... (fp8lab.recipe.Recipe.parse)")
    bf16_edge_blocks: int = option(0, "keep the first N and the last N decoder blocks out of FP8 (a loss remedy)")
    fuse: bool = option(True, "fused blocks (LayerNormLinear / LayerNormMLP, one QKV GEMM); False = swap Linear layers", check=BOOL)
    steps: int | None = option(None, "optimizer steps; default 100 when --tokens is not given either", check=optional(STEP_COUNT))
    tokens: int | None = option(None, "or: train this many tokens (all GPUs), rounded up to whole steps", check=optional(TOKEN_COUNT))
    micro_batch_size: AutoInt = option(AUTO, "sequences per GPU per forward/backward; auto: the largest that fits the GPU (fp8lab.layout), 4 on a CPU", check=AUTO_OR_POSITIVE_INT)
    grad_accum: AutoInt = option(AUTO, "micro-batches per optimizer step; auto: 131,072 tokens per GPU per step on a GPU (at most ~4M over all GPUs), 1 on a CPU", check=AUTO_OR_POSITIVE_INT)
    seq_len: AutoInt = option(AUTO, "tokens per sequence (at most the model's max_seq_len); auto: 2048 on a GPU, 256 on a CPU", check=AUTO_OR_POSITIVE_INT)
    lr: float = option(3e-4, "peak learning rate of AdamW", check=UNIT_OPEN)
    min_lr: float = option(3e-5, "end of the cosine decay")
    warmup_steps: int | None = option(None, "linear warm-up; default 5% of the steps (at most 1000)", check=optional(NONNEG_INT))
    weight_decay: float = option(0.1, "on matrices only (not norms, biases)", check=NONNEG_NUM)
    beta1: float = option(0.9, "AdamW's first-moment decay", check=UNIT_HALF_OPEN)
    beta2: float = option(0.95, "0.95 rather than 0.999: steadier for LLM pre-training", check=UNIT_HALF_OPEN)
    grad_clip: float = option(1.0, "max global gradient norm; 0 disables clipping (the norm is still logged)", check=NONNEG_NUM)
    activation_checkpointing: bool = option(False, "recompute each block in backward: less memory, ~1/3 more compute", check=BOOL)
    compile: bool = option(False, "torch.compile each decoder block", check=BOOL)
    cuda_graphs: str = option(AUTO, "replay each decoder block's forward and backward as CUDA graphs (TE fused layers, bf16 parameters, one GPU): auto = on where the step is launch-bound (small micro-batch) and the set-up supports it (fp8lab.graphs)", choices=CUDA_GRAPHS)
    seed: int = option(1234, "model init and data order", check=NONNEG_INT)
    data: str | None = option(None, "prepared folder (manifest.json), text file/folder, or hf:<dataset>; default: SM_CHANNEL_TRAIN, else the shipped corpus", check=optional(PATH))
    output_dir: str | None = option(None, "default: SM_OUTPUT_DATA_DIR on SageMaker, else runs/<model>-<precision>", check=optional(PATH))
    checkpoint_dir: str | None = option(None, "default: $FP8LAB_CHECKPOINT_DIR, /opt/ml/checkpoints on SageMaker, else <output-dir>/checkpoints", check=optional(PATH))
    model_dir: str | None = option(None, "final HF model; default: SM_MODEL_DIR on SageMaker, else <output-dir>/model", check=optional(PATH))
    checkpoint_every: int = option(0, "steps between checkpoints; 0 = only at the end and on SIGTERM; -1 = never", check=CHECKPOINT_EVERY)
    keep_checkpoints: int = option(2, "newest complete checkpoints kept", check=POSITIVE_INT)
    resume: bool = option(True, "continue from the newest complete checkpoint in the checkpoint folder", check=BOOL)
    resume_with_new_settings: bool = option(False, "resume even though steps/tokens, lr, min-lr, warm-up, AdamW or clipping differ from the checkpoint's; the LR then follows the new schedule from the checkpoint's step (fp8lab.resume)", check=BOOL)
    val_every: int = option(0, "validation loss every N steps (0: only at the end)", check=NONNEG_INT)
    val_batches: int = option(4, "validation size in global batches (micro-batch x grad-accum x ranks sequences each)", check=POSITIVE_INT)
    parallel: str = option("ddp", "under torchrun: ddp | fsdp (FSDP2 fully_shard per decoder block)", choices=PARALLEL)
    compute_dtype: str = option(AUTO, "torch.autocast dtype of non-FP8 math: auto (bf16 on GPU, fp32 on CPU) | bf16 | fp32", choices=COMPUTE_DTYPES)
    param_dtype: str = option(AUTO, "auto (bf16 on a GPU, fp32 on a CPU) | fp32 | bf16 (bf16 parameters and gradients, fp32 master weights in the optimizer; FSDP2: bf16 all-gathers)", choices=PARAM_DTYPES)
    fp8_weight_cache: bool = option(True, "with --grad-accum > 1 on TE fused layers (FSDP2: with --fsdp-keep-weights): cast weights to FP8 once per step, not per micro-batch", check=BOOL)
    fsdp_keep_weights: AutoBool = option(AUTO, "auto (on when several ranks shard with --grad-accum > 1 and it fits) | True | False; --parallel fsdp with --grad-accum > 1: all-gather weights once per step, not twice per micro-batch (unsharded-weight memory, as DDP)", check=AUTO_BOOL)
    fuse_wgrad_accumulation: bool = option(True, "TE fused layers, --param-dtype bf16, one process: weight-gradient GEMMs add into the gradient buffer in place", check=BOOL)
    device: str = option(AUTO, "auto | cpu | cuda", choices=DEVICES)
    gpu_memory_gib: float = option(0.0, "0 = the GPU's own memory; less caps this process to it (emulates a smaller GPU, e.g. 79.2 for P5's H100 80 GB) and sizes the layout for it", check=NONNEG_NUM)
    dry_run: bool = option(False, "print the resolved layout and memory estimate, build nothing, train nothing", check=BOOL)
    max_bad_steps: int = option(5, "K: this many non-finite steps in a row stop the run", check=POSITIVE_INT)
    peak_tflops: float = option(0.0, "dense BF16 peak for MFU; 0 = from the GPU name (fp8lab.metrics table)", check=NONNEG_NUM)
    save_model: bool = option(True, "write the final HF model (save_pretrained) to the model folder", check=BOOL)
    plot: bool = option(True, "write loss.png next to metrics.jsonl at the end", check=BOOL)
    progress: str = option(AUTO, "tqdm bar: auto (terminal or notebook) | on | off", choices=PROGRESS)
    print_metrics: bool = option(True, "the fp8lab-metrics line per step on stdout (rank 0)", check=BOOL)
    profile_steps: Steps = option((), "record these steps (smallest to largest) with torch.profiler; writes profile.json (time by kernel category)",
                                  check=step_numbers("comma-separated positive step numbers, e.g. 5,6 (steps 5 to 6 are recorded)"))
    inject_nan_at_steps: Steps = option((), "FOR TESTS ONLY: make the loss of these steps NaN (overflow guard)",
                                        check=step_numbers("comma-separated positive step numbers (testing only)"))

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def tokens_per_micro_batch(self) -> int | None:
        """None until the layout resolver has replaced "auto" (fp8lab.layout.apply)."""
        if AUTO in (self.micro_batch_size, self.seq_len):
            return None
        return self.micro_batch_size * self.seq_len

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inject_nan_at_steps"] = list(self.inject_nan_at_steps)
        d["profile_steps"] = list(self.profile_steps)
        return d


check_schema(TrainConfig)


def option_problem(name: str, value: Any) -> str | None:
    """What option ``name`` allows when its own check (its field's) refuses ``value``, else None.

    For callers that carry trainer options in their own fields (``fp8lab.launch.JobSpec``)."""
    check = {f.name: f.metadata["check"] for f in dataclasses.fields(TrainConfig)}[name]
    return None if check is None or check(value) else check.allowed


# ----------------------------------------------------------------------------------------------
# validation: each field's own check (fp8lab.options), then the checks across fields
# ----------------------------------------------------------------------------------------------

def _validate(c: TrainConfig) -> None:
    def bad(name: str, allowed: str) -> ValueError:
        return ValueError(f"{_opt(name)}={getattr(c, name)!r} is invalid; allowed: {allowed}")

    if not isinstance(c.model_overrides, dict):
        raise ValueError(f"--model-override must be key=value pairs (a dict), got {c.model_overrides!r}")
    mcfg = _model_config(c, bad)
    _check_recipe(c, bad)
    if not is_int(c.bf16_edge_blocks) or not 0 <= 2 * c.bf16_edge_blocks < mcfg.num_layers:
        raise bad("bf16_edge_blocks", f"an integer >= 0 that leaves some of {c.model}'s {mcfg.num_layers} blocks in FP8 "
                  f"(at most {(mcfg.num_layers - 1) // 2})")
    check_fields(c, bad)
    if c.precision == "fp8" and c.backend == "none":
        raise ValueError("--backend none cannot run --precision fp8; allowed: auto | " + " | ".join(FP8_BACKENDS))
    if c.backend in ("te", EMULATED):
        fused_check(c, c.backend)  # --backend auto: checked once resolved, still before anything is built
    if c.steps is not None and c.tokens is not None:
        raise ValueError(f"--steps={c.steps!r} and --tokens={c.tokens!r}: give one of them, not both")
    if c.seq_len != AUTO and c.seq_len > mcfg.max_seq_len:
        raise bad("seq_len", f"at most {mcfg.max_seq_len} for {c.model} (its max_seq_len)")
    if c.steps is not None and c.warmup_steps is not None and c.warmup_steps >= c.steps:
        raise bad("warmup_steps", f"fewer than --steps ({c.steps})")
    if not is_num(c.min_lr) or not 0 <= c.min_lr <= c.lr:
        raise bad("min_lr", f"a number in [0, --lr={c.lr}]")
    if c.data is not None and not c.data.startswith("hf:") and not Path(c.data).exists():
        raise bad("data", "an existing folder or file (prepared tokens or text), or hf:<dataset name>")
    if c.steps is not None and c.profile_steps and max(c.profile_steps) > c.steps:
        raise bad("profile_steps", f"steps within the run's --steps {c.steps}")


def _model_config(c: TrainConfig, bad: Callable[[str, str], ValueError]):
    """The run's ModelConfig: a named shape (with --model-override) or a user's folder (read and checked)."""
    from fp8lab import user_model
    from fp8lab.models import MODEL_CONFIGS, get_config

    if c.model not in MODEL_CONFIGS and not user_model.is_user_model(c.model):
        raise bad("model", ", ".join(MODEL_CONFIGS) + ", a model folder (config.json + optional *.safetensors) or hf:<repo id>")
    if c.model not in MODEL_CONFIGS:  # a user's folder: its config is read and checked (nothing is built)
        if c.model_overrides:
            raise ValueError(f"--model-override applies to the named models only; for --model={c.model!r} edit its "
                             f"config.json instead")
        return get_config(c.model)
    try:
        return get_config(c.model, **c.model_overrides)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--model-override: {exc}") from None


def _check_recipe(c: TrainConfig, bad: Callable[[str, str], ValueError]) -> None:
    if not isinstance(c.recipe, str) or c.recipe.partition(":")[0] not in RECIPES or c.recipe.startswith("auto:"):
        raise bad("recipe", " | ".join(RECIPES) + f", or kind:key=value,... with keys {', '.join(SETTINGS)}")
    if c.recipe != AUTO:
        try:
            Recipe.parse(c.recipe)
        except ValueError as exc:
            raise ValueError(f"--recipe={c.recipe!r} is invalid: {exc}") from None


# ----------------------------------------------------------------------------------------------
# command line (and SageMaker hyperparameters, which arrive as --key value strings)
# ----------------------------------------------------------------------------------------------



class OptionError(ValueError):
    """A run that cannot start as configured (bad option, unusable backend, data/model mismatch)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one clear line instead of usage + exit inside a library call
        raise ValueError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fp8lab train", description=__doc__.splitlines()[0], allow_abbrev=False,
                epilog="Booleans accept True/False (SageMaker passes hyperparameters as strings); "
                       "every option also has an underscore spelling (--micro_batch_size).")
    add_arguments(p, TrainConfig)
    return p


def parse_args(argv: list[str]) -> TrainConfig:
    """TrainConfig from CLI-style arguments; every value is converted and checked with a clear message."""
    args = vars(build_parser().parse_args(argv))
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    kwargs = {name: from_text(fields[name], raw) for name, raw in args.items() if raw is not None}
    config = TrainConfig(**kwargs)
    fvalidate.check_cli_recipe(config, "recipe" in kwargs)
    return config


def _sagemaker_argv() -> list[str]:
    """Hyperparameters from SM_HPS (JSON) when the job passed none on the command line."""
    raw = os.environ.get("SM_HPS")
    if not raw:
        return []
    return [w for k, v in json.loads(raw).items() if not k.startswith("sagemaker_") for w in (f"--{k}", to_text(v))]


# ----------------------------------------------------------------------------------------------
# where things go
# ----------------------------------------------------------------------------------------------

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
    from fp8lab.models import MODEL_CONFIGS

    if model in MODEL_CONFIGS:
        return model
    name = model[3:] if model.startswith("hf:") else Path(model).resolve().name
    return "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in name).strip(".-") or "model"


def fused_check(c: TrainConfig, backend: str | None) -> None:
    """Refuse, before anything is built, a model the fused conversion cannot represent exactly."""
    from fp8lab import user_model
    from fp8lab.convert import fused_problem

    if backend in (None, "torchao") or not c.fuse or not user_model.is_user_model(c.model):
        return  # torchao has no fused form; the named shapes are all representable
    problem = fused_problem(user_model.hf_config(c.model))
    if problem:
        raise ValueError(f"--model={c.model!r}: {problem}")


def resolve_paths(c: TrainConfig) -> RunPaths:
    """Output, checkpoint and model folders for this run (SageMaker's when inside a job)."""
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


def data_source(c: TrainConfig) -> str | None:
    return c.data if c.data is not None else os.environ.get("SM_CHANNEL_TRAIN")


# ----------------------------------------------------------------------------------------------
# pieces of the run
# ----------------------------------------------------------------------------------------------

def resolve_fp8(c: TrainConfig, te_usable: bool = False):
    """(backend name or None, Recipe or None) for this run, with a clear error if unusable here.

    ``--precision bf16 --backend auto`` runs Transformer Engine's fused layers with FP8 off where TE
    is usable (``te_usable``: a GPU with TE), the fastest BF16 fp8lab has and the same layers as the
    FP8 run; elsewhere the plain transformers model (what ``--backend none`` always runs)."""
    from fp8lab.convert import pick_backend
    from fp8lab.backends import get_backend

    if c.backend == "none" or (c.backend == "auto" and c.precision == "bf16" and not te_usable):
        return None, None
    name = "te" if (c.backend == "auto" and c.precision == "bf16") else pick_backend(c.backend)
    be = get_backend(name)
    reason = be.available()
    if reason is not None:
        raise ValueError(f"--backend {name}: not usable on this machine: {reason}. On a CPU use --backend emulated")
    recipe = be.default_recipe if c.recipe == "auto" else Recipe.parse(c.recipe)
    return name, recipe


def fsdp_te_problem(c: TrainConfig, backend: str | None, distributed: bool) -> str | None:
    """Why this FSDP2 + Transformer Engine layout cannot train, or None.

    TE 2.20 under FSDP2 does not keep a high-precision weight it had to cast for backward (it
    expects to re-quantize it there, which only FP8 does): fp32 parameters under bf16 autocast with
    FP8 off fail at the first backward ("GEMM requested the columnwise representation, but it is
    unavailable"). bf16 parameters (FSDP2 gathers them in bf16) need no cast and train.
    """
    if backend == "te" and distributed and c.parallel == "fsdp" and c.precision == "bf16" and c.param_dtype == "fp32":
        return ("--parallel fsdp with --backend te and --precision bf16 needs --param-dtype bf16: Transformer "
                "Engine under FSDP2 cannot run backward on fp32 parameters cast to bf16 with FP8 off; allowed: "
                "--param-dtype bf16 (fp32 master weights stay in the optimizer), --parallel ddp, or --precision fp8")
    return None


def schedule(c: TrainConfig, world_size: int) -> tuple[int, int]:
    """(optimizer steps, warm-up steps) of a run whose layout is resolved."""
    tokens_per_step = c.micro_batch_size * c.grad_accum * world_size * c.seq_len
    total_steps = c.steps if c.steps is not None else (math.ceil(c.tokens / tokens_per_step) if c.tokens else 100)
    warmup = c.warmup_steps if c.warmup_steps is not None else min(1000, total_steps // 20)
    if warmup >= total_steps:
        raise ValueError(f"--warmup-steps={warmup} is invalid; allowed: fewer than the run's {total_steps} steps")
    return total_steps, warmup


def preflight(c: TrainConfig, machine, backend: str | None, mcfg=None):
    """Every start-up check that needs no data, model or GPU, with the layout resolved for ``machine``.

    Returns (config with no "auto" layout option left, Layout, total steps, warm-up steps); a bad
    combination is a ValueError naming the option. The trainer calls it at start-up and the
    SageMaker launcher for each planned job (``machine`` = the instance's GPU at 8 x instances
    ranks), so a job the trainer would refuse is refused when the plan is made."""
    from fp8lab import layout as flayout

    c, layout = flayout.apply(c, machine, backend)  # "auto" options -> this machine's layout (or a clear refusal)
    problem = fsdp_te_problem(c, backend, machine.world_size > 1)
    if problem:
        raise ValueError(problem)
    total_steps, warmup = schedule(c, machine.world_size)
    graphs_decision(c, machine, backend, layout, mcfg)  # --cuda-graphs on with a set-up that cannot be captured: refused here
    return c, layout, total_steps, warmup


def graphs_decision(c: TrainConfig, machine, backend: str | None, layout, mcfg=None):
    """Whether this run replays its blocks as CUDA graphs (fp8lab.graphs.Decision), for its resolved layout.

    ``mcfg``: the run's ModelConfig where the caller has it (else read from ``c``)."""
    from fp8lab import graphs
    from fp8lab import layout as flayout
    from fp8lab.models import get_config

    if c.cuda_graphs == "off":
        return graphs.decide("off", None, micro_batch_size=c.micro_batch_size, seq_len=c.seq_len)
    mcfg = mcfg or get_config(c.model, **c.model_overrides)
    memory = flayout.graphs_memory_problem(layout, machine, mcfg, fp8=c.precision == "fp8") if machine.gpu else None
    return graphs.decide(c.cuda_graphs, mcfg, micro_batch_size=c.micro_batch_size, memory_problem=memory,
                         precision=c.precision,
                         seq_len=c.seq_len, device_type=machine.device, backend=backend, fuse=c.fuse,
                         param_dtype=c.param_dtype, world_size=machine.world_size,
                         activation_checkpointing=c.activation_checkpointing, compile=c.compile)


def lr_lambda(c: TrainConfig, total_steps: int, warmup: int) -> Callable[[int], float]:
    """Multiplier of --lr after ``i`` optimizer steps: linear warm-up, then cosine down to --min-lr."""
    def f(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        progress = min(1.0, (i - warmup) / max(1, total_steps - warmup))
        return (c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))) / c.lr
    return f


def make_optimizer(model, c: TrainConfig, device, sharded: bool = False):
    """AdamW, weight decay on matrices only; fused kernels on GPU (foreach when FSDP2 shards).

    ``model`` is a module or a list of parameters (the fp32 masters of ``--param-dtype bf16``).
    ``sharded``: FSDP2 is really in use (several processes and --parallel fsdp); one process
    with --parallel fsdp trains unsharded and gets the fused kernels (foreach AdamW makes
    full-size temporaries: 27 GB at 7B, and it is slower)."""
    import torch

    decay, no_decay = [], []
    for p in (model.parameters() if isinstance(model, torch.nn.Module) else model):
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": c.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw: dict[str, Any] = {}
    if device.type == "cuda":
        kw = {"foreach": True} if sharded else {"fused": True}
    return torch.optim.AdamW(groups, lr=c.lr, betas=(c.beta1, c.beta2), **kw)


def apply_activation_checkpointing(model, backend: str | None, fp8_context: Callable[[], Any]) -> int:
    """Recompute every decoder block in backward; returns how many blocks were wrapped.

    Transformer Engine recomputes with its own ``te.checkpoint`` (keeps FP8 scaling state right);
    other backends use ``torch.utils.checkpoint`` re-entering their FP8 region for the recompute.
    The block's ``forward`` is wrapped on the instance, so parameter names do not change.
    """
    import functools

    import torch.utils.checkpoint as tuc

    from fp8lab.distributed import block_list

    blocks = block_list(model)
    for block in blocks:
        fwd = block.forward
        if backend == "te":
            import transformer_engine.pytorch as te

            # non-reentrant: blocks take non-tensor arguments (RoPE tables as a tuple, HF kwargs)
            block.forward = functools.partial(te.checkpoint, fwd, use_reentrant=False)
        else:
            block.forward = functools.partial(
                tuc.checkpoint, fwd, use_reentrant=False, context_fn=lambda: (nullcontext(), fp8_context()))
    return len(blocks)


def _export_hf_state_dict(model, inner, conversion, master=None) -> dict:
    """Full HF-named weights on rank 0 (every rank must call: FSDP2 gathers the shards).

    Under ``--param-dtype bf16`` the weights are fp32: the optimizer's fp32 masters (``master``, one
    process / DDP), or FSDP2's fp32 sharded parameters (it casts to bf16 only when gathering)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if master is not None and full:
        full = master.model_state_dict(full)
    if conversion is None or not full:  # plain HF model, or a rank other than 0
        return full
    from fp8lab.convert import hf_state_dict_from

    return hf_state_dict_from(inner, full)


def save_hf_model(model, inner, conversion, c: TrainConfig, model_dir: Path, data_dir: Path, env, master=None) -> None:
    """``save_pretrained`` of the trained weights in the original HF class, plus the tokenizer.

    ``model`` is what trained (maybe DDP/FSDP-wrapped), ``inner`` the module inside it, ``master``
    the fp32 master weights of ``--param-dtype bf16`` (written instead of the bf16 parameters)."""
    from fp8lab import user_model
    from fp8lab.models import build_model

    sd = _export_hf_state_dict(model, inner, conversion, master)
    if not env.is_main:
        return
    from transformers import PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    hf = build_model(c.model, device="meta", **c.model_overrides)  # a user's folder: its own config
    model_dir.mkdir(parents=True, exist_ok=True)
    bar_was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one-shard "Writing model shards" bars only clutter the log
    try:
        hf.save_pretrained(str(model_dir), state_dict=sd)
    finally:
        if bar_was_on:
            hf_logging.enable_progress_bar()

    if user_model.copy_tokenizer(c.model, model_dir):  # the user's folder had a tokenizer: it goes back along
        return  # (the data were tokenized with fp8lab's tokenizer: see fp8lab.user_model)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(data_dir / "tokenizer.json"), eos_token=fdata.EOS_TOKEN)
    tok.save_pretrained(str(model_dir))


# ----------------------------------------------------------------------------------------------
# the run
# ----------------------------------------------------------------------------------------------

def train(config: TrainConfig | None = None, *, argv: list[str] | None = None) -> dict[str, Any]:
    """Run one training job as configured; returns the summary (also written to summary.json)."""
    from fp8lab import distributed as fdist

    c = config or TrainConfig()
    try:
        env = fdist.setup(c.device)
    except ValueError as exc:
        raise OptionError(str(exc)) from exc
    try:
        from fp8lab.trainer import run  # the Trainer: setup, fit, finish

        return run(c, env, argv)
    finally:
        fdist.teardown(env)


def main(argv: list[str] | None = None) -> int:
    """``fp8lab train`` / ``python -m fp8lab.train``: 0 done, 2 bad options, 3 overflow guard stop."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a in ("-h", "--help") for a in argv):
        build_parser().print_help()
        return 0
    if not argv and os.environ.get("SM_HPS"):
        argv = _sagemaker_argv()
    try:
        config = parse_args(argv)
    except ValueError as exc:
        print(f"fp8lab train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    try:
        summary = train(config, argv=argv)
    except OptionError as exc:  # environment checks (device, backend, data, resume) before training
        print(f"fp8lab train: error: {exc}", file=sys.stderr)
        return EXIT_BAD_OPTIONS
    return {"stopped_nonfinite": EXIT_OVERFLOW, "checkpoint_failed": EXIT_CHECKPOINT_FAILED}.get(summary["status"], 0)


if __name__ == "__main__":  # python -m fp8lab.train: run the imported module's main, so that its OptionError is
    from fp8lab.train import main as _main  # the one fp8lab.trainer raises (this file is also loaded as __main__)

    raise SystemExit(_main())
