"""``TrainConfig``: every option of a training run, what was *requested* ("auto" included), each option
declared once on its field (fp8lab.plan.options), validated once on construction and never replaced (the
effective decisions are the plan's: fp8lab.plan.runplan). Its own module so that what only needs the options
(the planner, ``JobSpec``, the notebooks' checks) never imports the entry points (fp8lab.train.entry), which
run the trainer."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from fp8lab.plan import lora as lora_plan
from fp8lab.plan.options import (BACKENDS, COMPUTE_DTYPES, CUDA_GRAPHS, DEVICES, EMULATED, FP8_ALL_GATHER,  # noqa: F401
                            FP8_ATTENTION, FP8_BACKENDS, FP8_LM_HEAD_BACKENDS, FP8_STATS_SOURCES, FUSED_LOSS, MEMORY,
                            FP8_WEIGHTS,
                            PARALLEL, PARAM_DTYPES, PRECISIONS, PROGRESS, RECIPES, TASKS, TRACKERS, AutoBool, AutoInt,
                            Steps, check_fields, check_schema, flag, option, section_of)
from fp8lab.fp8.backends import fused_problem
from fp8lab.model import user as user_model
from fp8lab.model.models import MODEL_CONFIGS, get_config, sequence_overrides
from fp8lab.fp8.recipe import KINDS, SETTINGS, Recipe
from fp8lab.core.validate import (AUTO, AUTO_BOOL, AUTO_OR_BATCH_COUNT, AUTO_OR_NONNEG_INT, AUTO_OR_POSITIVE_INT,
                                  BATCH_COUNT, BOOL, DECAY, MEMORY_GIB, NONNEG_INT, NONNEG_NUM, PATH, PEAK_TFLOPS,
                                  POSITIVE_INT, SEED, STEP_COUNT, TOKEN_COUNT, UNIT_HALF_OPEN, UNIT_OPEN, Check,
                                  is_count,
                                  is_int, is_num, optional, step_numbers)

if TYPE_CHECKING:
    from fp8lab.model.config import ModelConfig

CHECKPOINT_EVERY = Check(lambda v: is_count(v, -1), "an integer: N > 0 steps, 0 = only at the end, -1 = never")


@dataclass(frozen=True)
class TrainConfig:
    """Every option of a training run; CLI flags and SageMaker hyperparameters have the same names.

    Each field is the option's one declaration (fp8lab.plan.options): its help, choices or check, and,
    from its type, how its text is read. Validated on construction: a bad value raises ValueError
    naming the option (``--seq-len``) and what is allowed, before anything is built or downloaded.
    """

    # each option's section (fp8lab.plan.options.SECTIONS) orders --help; the fields keep their order
    model: str = option("llama-tiny", "a named shape (" + ", ".join(MODEL_CONFIGS) + "), a model folder (config.json, "
                        "optional *.safetensors) or hf:<repo id>", section="model")
    model_overrides: dict = option(help="a ModelConfig field, e.g. num_layers=2 (repeat, or comma-separate)",
                                   section="model", factory=dict, metavar="KEY=VALUE",
                                   flags=("--model-override", "--model_override"))
    precision: str = option("bf16", "the precision of the block GEMMs", section="fp8", choices=PRECISIONS)
    backend: str = option("auto", "the layers that run: none (the plain HF model) | " + " | ".join(FP8_BACKENDS),
                          section="fp8", choices=BACKENDS)
    recipe: str = option("auto", "FP8 scaling: " + " | ".join(KINDS) + ", optionally kind:key=value,...; auto: "
                         "the backend's default (sft: current)", section="fp8")
    bf16_edge_blocks: int = option(0, "keep the first N and the last N decoder blocks out of FP8", section="fp8")
    fuse: AutoBool = option(AUTO, "fused blocks (LayerNormLinear / LayerNormMLP, one QKV GEMM); False: swap Linear "
                            "layers (under --lora-rank: peft's adapters); auto: fused", section="kernels",
                            check=AUTO_BOOL)
    steps: int | None = option(None, "optimizer steps; default 100 when --tokens is not given either", section="data",
                               check=optional(STEP_COUNT))
    tokens: int | None = option(None, "or: train this many tokens (all GPUs), rounded up to whole steps",
                                section="data",
                                check=optional(TOKEN_COUNT))
    micro_batch_size: AutoInt = option(AUTO, "sequences per GPU per forward/backward; auto: the largest that fits",
                                       section="layout", check=AUTO_OR_POSITIVE_INT)
    grad_accum: AutoInt = option(AUTO, "micro-batches per optimizer step", section="layout",
                                 check=AUTO_OR_BATCH_COUNT)
    seq_len: AutoInt = option(AUTO, "tokens per sequence (longer than a named Llama shape's: trained from scratch)",
                              section="layout", check=AUTO_OR_POSITIVE_INT)
    lr: float = option(3e-4, "peak learning rate of AdamW", section="optimiser", check=UNIT_OPEN)
    min_lr: float = option(3e-5, "end of the cosine decay", section="optimiser")
    warmup_steps: int | None = option(None, "linear warm-up; default 5% of the steps (at most 1000)",
                                      section="optimiser", check=optional(NONNEG_INT))
    weight_decay: float = option(0.1, "on matrices only (not norms, biases)", section="optimiser", check=DECAY)
    beta1: float = option(0.9, "AdamW's first-moment decay", section="optimiser", check=UNIT_HALF_OPEN)
    beta2: float = option(0.95, "AdamW's second-moment decay", section="optimiser", check=UNIT_HALF_OPEN)
    grad_clip: float = option(1.0, "max global gradient norm; 0 disables clipping (the norm is still logged)",
                              section="optimiser", check=NONNEG_NUM)
    activation_checkpointing: AutoBool = option(AUTO, "recompute each block in backward: less memory, more compute",
                                                section="layout", check=AUTO_BOOL)
    compile: bool = option(False, "torch.compile each decoder block", section="kernels", check=BOOL)
    cuda_graphs: str = option(AUTO, "replay each decoder block's forward and backward as CUDA graphs",
                              section="kernels", choices=CUDA_GRAPHS)
    seed: int = option(1234, "model init and data order", section="model", check=SEED)
    data: str | None = option(None, "prepared token folder, text file or folder, or hf:<dataset>; default: "
                              "SM_CHANNEL_TRAIN, else the shipped corpus", section="data", check=optional(PATH))
    task: str = option("pretrain", "pretrain: next-token loss on text | sft: instruction JSONL (messages or "
                       "prompt/response), loss on the answers only", section="data", choices=TASKS)
    output_dir: str | None = option(None, "default: SM_OUTPUT_DATA_DIR on SageMaker, else runs/<model>-<precision>",
                                    section="outputs", check=optional(PATH))
    checkpoint_dir: str | None = option(None, "default: $FP8LAB_CHECKPOINT_DIR, /opt/ml/checkpoints on SageMaker, "
                                        "else <output-dir>/checkpoints", section="outputs", check=optional(PATH))
    model_dir: str | None = option(None, "final HF model; default: SM_MODEL_DIR on SageMaker, else <output-dir>/model",
                                   section="outputs", check=optional(PATH))
    checkpoint_every: int = option(0, "steps between checkpoints; 0: only at the end and on SIGTERM; -1: never",
                                   section="outputs", check=CHECKPOINT_EVERY)
    keep_checkpoints: int = option(2, "newest complete checkpoints kept", section="outputs", check=POSITIVE_INT)
    resume: bool = option(True, "continue from the newest complete checkpoint in the checkpoint folder",
                          section="outputs", check=BOOL)
    resume_with_new_settings: bool = option(False, "resume although the schedule, AdamW, clipping or the LM head's "
                                            "precision differ from the checkpoint's", section="outputs", check=BOOL)
    val_every: int = option(0, "validation loss every N steps (0: only at the end)", section="data",
                            check=NONNEG_INT)
    val_batches: int = option(4, "validation size in global batches", section="data", check=BATCH_COUNT)
    parallel: str = option("ddp", "under torchrun: DDP, or FSDP2 fully_shard per decoder block", section="layout",
                           choices=PARALLEL)
    compute_dtype: str = option(AUTO, "torch.autocast dtype of the non-FP8 math", section="kernels",
                                choices=COMPUTE_DTYPES)
    param_dtype: str = option(AUTO, "dtype of parameters and gradients (bf16: fp32 master weights in the optimizer)",
                              section="layout", choices=PARAM_DTYPES)
    memory: str = option(AUTO, "model-state memory per parameter (fp8lab.plan.memory_modes): auto keeps plain where "
                         "the run fits, else the least lossy mode that fits and passed its loss check",
                         section="optimiser", choices=MEMORY)
    fp8_weights: str = option(AUTO, "FP8 runs: the blocks' weights as bf16 cast to FP8 (cast) or kept only in FP8, "
                              "written from the fp32 masters (primary; needs --memory offload)", section="fp8",
                              choices=FP8_WEIGHTS)
    fp8_weight_cache: bool = option(True, "with --grad-accum > 1 on TE fused layers: cast weights to FP8 once per step",
                                    section="fp8", check=BOOL)
    fp8_calibrate: bool = option(True, "delayed scaling, a new run: one forward and backward before step 1 (no update) "
                                 "fills the amax history, so step 1 casts with measured scales", section="fp8",
                                 check=BOOL)
    fsdp_keep_weights: AutoBool = option(AUTO, "--parallel fsdp: all-gather the weights once per step, not per "
                                         "micro-batch", section="layout", check=AUTO_BOOL)
    fuse_wgrad_accumulation: bool = option(True, "TE fused layers, bf16 parameters, one process: weight gradients "
                                           "added in place", section="kernels", check=BOOL)
    device: str = option(AUTO, "where to train", section="layout", choices=DEVICES)
    gpu_memory_gib: float = option(0.0, "cap this process's GPU memory to this many GiB and size the layout for it "
                                   "(0: the GPU's own)", section="layout", check=MEMORY_GIB)
    lora_rank: int = option(0, "LoRA: train adapters of this rank beside the frozen (FP8) projections; 0: off, every "
                            "weight trains", section="lora", check=lora_plan.RANK)
    lora_alpha: float = option(16.0, "LoRA: the adapters' update is scaled by alpha / rank", section="lora",
                              check=lora_plan.ALPHA)
    lora_dropout: float = option(0.0, "LoRA: dropout on the adapters' input", section="lora",
                                check=lora_plan.DROPOUT)
    lora_targets: str = option(lora_plan.ALL, "LoRA: the projections adapted, by module name (all: every attention and "
                               "MLP projection)", section="lora")
    export_merged: bool = option(False, "LoRA: also write the model with the adapters merged in (a plain "
                                 "transformers folder) to <model-dir>/merged", section="lora", check=BOOL)
    dry_run: bool = option(False, "print the plan and memory estimate; build and train nothing", section="outputs",
                           check=BOOL)
    max_bad_steps: int = option(5, "this many non-finite steps in a row stop the run", section="optimiser",
                                check=POSITIVE_INT)
    peak_tflops: float = option(0.0, "dense BF16 peak for MFU; 0: from the GPU name", section="outputs",
                                check=PEAK_TFLOPS)
    save_model: bool = option(True, "write the final HF model (save_pretrained) to the model folder",
                              section="outputs", check=BOOL)
    plot: bool = option(True, "write loss.png next to metrics.jsonl at the end", section="outputs", check=BOOL)
    progress: str = option(AUTO, "tqdm bar (auto: in a terminal or notebook)", section="outputs", choices=PROGRESS)
    print_metrics: bool = option(True, "the fp8lab-metrics line per step on stdout (rank 0)", section="outputs",
                                 check=BOOL)
    profile_steps: Steps = option((), "record these steps with torch.profiler into profile.json", section="outputs",
                                  check=step_numbers("comma-separated positive step numbers, e.g. 5,6 (steps 5 to 6 "
                                                     "are recorded)"))
    inject_nan_at_steps: Steps = option((), "tests: make the loss of these steps NaN (the overflow guard)",
                                        section="study",
                                        check=step_numbers("comma-separated positive step numbers (testing only)"))
    fp8_attention: str = option(AUTO, "TE's FP8 dot-product attention (fused TE blocks, --precision fp8)",
                                section="fp8", choices=FP8_ATTENTION)
    fp8_all_gather: str = option(AUTO, "--parallel fsdp: all-gather the block linears' weights in FP8 (torchao)",
                                 section="fp8", choices=FP8_ALL_GATHER)
    fp8_stats_every: AutoInt = option(AUTO, "FP8 runs: per-layer amax, scale, underflow and saturation every K steps "
                                      "(0: off)", section="fp8", check=AUTO_OR_NONNEG_INT)
    fp8_stats_source: str = option(AUTO, "who reads the FP8 casts on --backend te: te-debug (TE's debug API) | fp8lab "
                                   "(fp8lab's hooks)", section="fp8", choices=FP8_STATS_SOURCES)
    fused_loss: str = option(AUTO, "the LM head and cross-entropy chunked over tokens (never the full fp32 logits)",
                             section="kernels", choices=FUSED_LOSS)
    fp8_lm_head: AutoBool = option(AUTO, "the LM head's GEMMs in FP8 too (--precision fp8); auto: in the fused loss's "
                                   "chunks on an FP8 GPU, once its GPU check passes", section="fp8",
                                   check=AUTO_BOOL)

    # where users keep runs (fp8lab.train.trackers): metrics.jsonl mirrored into TensorBoard or MLflow
    tracker: str = option("none", "also write the metrics to TensorBoard event files or MLflow (each needs its "
                          "package: pip install 'fp8lab[tensorboard]' / 'fp8lab[mlflow]')", section="outputs",
                          choices=TRACKERS)
    tracker_dir: str | None = option(None, "where --tracker writes; default <output-dir>/tensorboard or "
                                     "<output-dir>/mlflow", section="outputs", check=optional(PATH))

    def __post_init__(self) -> None:
        _validate(self)

    @functools.cached_property  # a frozen dataclass: written straight into __dict__, by the validation
    def model_config(self) -> "ModelConfig":
        """The run's ModelConfig: a named shape with its ``shape_overrides``, or a user's folder's (read and
        checked). Made once, when the options are validated; the plan carries it (``RunPlan.model_config``)."""
        return _model_config(self, _bad(self))

    @property
    def shape_overrides(self) -> dict:
        """``model_overrides`` as the model is built: a named shape's max_seq_len raised to a longer
        ``--seq-len`` (a from-scratch run: fp8lab.model.models.sequence_overrides)."""
        return sequence_overrides(self.model, self.model_overrides, self.seq_len)

    @property
    def tokens_per_micro_batch(self) -> int | None:
        """None where the layout resolver picks micro-batch or sequence ("auto": fp8lab.plan.runplan has the values)."""
        if AUTO in (self.micro_batch_size, self.seq_len):
            return None
        return self.micro_batch_size * self.seq_len

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["inject_nan_at_steps"] = list(self.inject_nan_at_steps)
        d["profile_steps"] = list(self.profile_steps)
        return d


check_schema(TrainConfig)
# the LoRA options but the rank, at their declared defaults: without --lora-rank a changed one would be ignored, so
# it is refused (fp8lab.plan.lora.problem); JobSpec and the notebooks pass the defaults, which stay accepted
LORA_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)
                  if section_of(f) == "lora" and f.name != "lora_rank"}


def option_problem(name: str, value: Any) -> str | None:
    """What option ``name`` allows when its own check (its field's) refuses ``value``, else None.

    For callers that carry trainer options in their own fields (``fp8lab.launch.JobSpec``)."""
    check = {f.name: f.metadata["check"] for f in dataclasses.fields(TrainConfig)}[name]
    return None if check is None or check(value) else check.allowed


# ----------------------------------------------------------------------------------------------
# validation: each field's own check (fp8lab.plan.options), then the checks across fields
# ----------------------------------------------------------------------------------------------

def _bad(c: TrainConfig) -> Callable[[str, str], ValueError]:
    def bad(name: str, allowed: str) -> ValueError:
        return ValueError(f"{flag(name)}={getattr(c, name)!r} is invalid; allowed: {allowed}")

    return bad


def _validate(c: TrainConfig) -> None:
    bad = _bad(c)
    if not isinstance(c.model_overrides, dict):
        raise ValueError(f"--model-override must be key=value pairs (a dict), got {c.model_overrides!r}")
    mcfg = c.model_config  # made here, once (TrainConfig.model_config)
    _check_recipe(c)
    if not is_int(c.bf16_edge_blocks) or not 0 <= 2 * c.bf16_edge_blocks < mcfg.num_layers:
        raise bad("bf16_edge_blocks",
                  f"an integer >= 0 that leaves some of {c.model}'s {mcfg.num_layers} blocks in FP8 "
                  f"(at most {(mcfg.num_layers - 1) // 2})")
    check_fields(c, bad)
    if c.precision == "fp8" and c.backend == "none":
        raise ValueError("--backend none cannot run --precision fp8; allowed: auto | " + " | ".join(FP8_BACKENDS))
    if c.backend in ("te", EMULATED):
        fused_check(c, c.backend)  # --backend auto: checked once resolved, still before anything is built
    if c.fp8_lm_head is True and c.precision != "fp8":
        raise ValueError(f"--fp8-lm-head True needs --precision fp8 (got {c.precision}): a BF16 run has no FP8 GEMM; "
                         "allowed: --fp8-lm-head auto | False, or --precision fp8")
    if c.steps is not None and c.tokens is not None:
        raise ValueError(f"--steps={c.steps!r} and --tokens={c.tokens!r}: give one of them, not both")
    if c.seq_len != AUTO and c.seq_len > mcfg.max_seq_len:  # a named Llama shape's was raised (shape_overrides)
        limit = ("its --model-override max_seq_len" if "max_seq_len" in c.model_overrides else
                 f"its learned position table has {mcfg.max_seq_len} rows; a from-scratch run may grow it with "
                 f"--model-override max_seq_len=N, a bigger model" if mcfg.family == "gptneo" and c.model
                 in MODEL_CONFIGS else
                 "its max_position_embeddings: the length its weights were trained for")
        raise bad("seq_len", f"at most {mcfg.max_seq_len} for {c.model} ({limit})")
    if c.steps is not None and c.warmup_steps is not None and c.warmup_steps >= c.steps:
        raise bad("warmup_steps", f"fewer than --steps ({c.steps})")
    if not is_num(c.min_lr) or not 0 <= c.min_lr <= c.lr:
        raise bad("min_lr", f"a number in [0, --lr={c.lr}]")
    if (lora := lora_plan.problem(c, mcfg, LORA_DEFAULTS)) is not None:  # a huge rank: here, not in the memory plan
        raise bad(*lora)
    if c.data is not None and not c.data.startswith("hf:") and not Path(c.data).exists():
        raise bad("data", "an existing folder or file (prepared tokens or text), or hf:<dataset name>")
    if c.task == "sft" and c.data is not None and c.data.startswith("hf:"):
        raise bad("data", "with --task sft: a .jsonl file of instruction records (messages, or prompt/response) or a "
                  "folder prepared with fp8lab prepare-data --task sft")
    if c.steps is not None and c.profile_steps and max(c.profile_steps) > c.steps:
        raise bad("profile_steps", f"steps within the run's --steps {c.steps}")


def _model_config(c: TrainConfig, bad: Callable[[str, str], ValueError]):
    """The run's ModelConfig: a named shape (with --model-override) or a user's folder (read and checked)."""
    if c.model not in MODEL_CONFIGS and not user_model.is_user_model(c.model):
        raise bad("model",
                  ", ".join(MODEL_CONFIGS) + ", a model folder (config.json + optional *.safetensors) or hf:<repo id>")
    if c.model not in MODEL_CONFIGS:  # a user's folder: its config is read and checked (nothing is built)
        if c.model_overrides:
            raise ValueError(f"--model-override applies to the named models only; for --model={c.model!r} edit its "
                             f"config.json instead")
        return get_config(c.model)
    try:
        return get_config(c.model, **c.shape_overrides)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"--model-override: {exc}") from None


def fp8_lm_head_check(backend: str | None, fused: bool) -> None:
    """Refuse ``--fp8-lm-head True`` where it cannot run, once the plan knows the backend and whether the loss is
    chunked (fp8lab.plan.runplan.plan_run), before anything is built: the chunks' FP8 GEMMs run beside any backend;
    over the full logits the head becomes the backend's FP8 layer, which only some backends have."""
    if not fused and backend not in FP8_LM_HEAD_BACKENDS:
        raise ValueError(f"--fp8-lm-head True without the fused loss, with --backend {backend}: allowed backends: "
                         + " | ".join(FP8_LM_HEAD_BACKENDS) + "; or --fused-loss on (the head's GEMMs in FP8 in each "
                         "chunk, any backend)")


def fused_check(c: TrainConfig, backend: str | None) -> None:
    """Refuse, before anything is built, a user's model the fused conversion cannot represent exactly (here for
    an explicit backend, in fp8lab.plan.runplan.plan_run once ``auto`` is resolved)."""
    if backend in (None, "torchao") or not lora_plan.fuses(c) or not user_model.is_user_model(c.model):
        return  # torchao has no fused form; the named shapes are all representable
    problem = fused_problem(user_model.hf_config(c.model))
    if problem:
        raise ValueError(f"--model={c.model!r}: {problem}")


def recipe_problem(value: Any) -> str | None:
    """Why ``value`` is no recipe option, as the end of "<option>=<value> is invalid...": outside the
    vocabulary ("; allowed: ..."), or settings ``Recipe.parse`` refuses (": why"); None: it is one.
    The one recipe check, for the trainer and for callers with their own field (``fp8lab.launch.JobSpec``)."""
    if not isinstance(value, str) or value.partition(":")[0] not in RECIPES or value.startswith("auto:"):
        return "; allowed: " + " | ".join(RECIPES) + f", or kind:key=value,... with keys {', '.join(SETTINGS)}"
    if value != AUTO:
        try:
            Recipe.parse(value)
        except ValueError as exc:
            return f": {exc}"
    return None


def _check_recipe(c: TrainConfig) -> None:
    if (why := recipe_problem(c.recipe)) is not None:
        raise ValueError(f"{flag('recipe')}={c.recipe!r} is invalid{why}")
