"""Plan a run once: every effective decision of a ``TrainConfig`` on a ``Machine``, each with its reason.

``plan_run(config, machine, evidence) -> RunPlan`` is a pure function of what it is given and imports no torch,
so the trainer (on the machine it runs on), ``JobSpec`` (on a SageMaker instance it cannot see) and ``--dry-run``
make the same decisions the same way. ``machine`` carries the facts of where the run goes (its GPU, Transformer
Engine's release, TE's debug API, the fused loss's kernel); ``evidence`` the committed GPU checks some ``auto``
rules wait for (fp8lab.plan.evidence: the packaged values unless given). ``TrainConfig`` stays what was requested
("auto" included); the plan holds what runs:

* the backend and its FP8 recipe (:func:`select_backend`: ``--backend auto`` picks one here);
* the batch layout (``fp8lab.plan.layout.resolve``: parameters' dtype, sequence, micro-batch,
  accumulation, FSDP2 kept weights, activation checkpointing) with its memory estimate;
* the length of the run: optimizer steps and warm-up (:func:`schedule`);
* CUDA graphs (``fp8lab.plan.graphs.decide``), TE's FP8 weight cache, fused weight-gradient
  accumulation, fp32 master weights and their streamed step, the compute dtype;
* the fused linear cross-entropy (``fp8lab.plan.fused_loss.decide``, by vocabulary x tokens per micro-batch).

A combination that cannot run is a ValueError naming the option, before anything is built.
``Trainer(plan, env)`` (fp8lab.train.trainer) builds what the plan says.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fp8lab.model.models import longer_sequence_note
from fp8lab.plan import fp8attn, graphs
from fp8lab.plan import layout as flayout
from fp8lab.plan import fp8_stats
from fp8lab.plan.fused_loss import kernel_for as loss_kernel_for
from fp8lab.plan.fp8_stats import fp8_stats_decision
from fp8lab.plan.config import fp8_lm_head_check, fused_check
from fp8lab.plan.lora import fuses
from fp8lab.plan.options import FP8_ALL_GATHER_BACKENDS
from fp8lab.fp8.backends import DEFAULT_RECIPES, auto_fp8_backend
from fp8lab.core.hardware import Machine
from fp8lab.core.validate import AUTO
from fp8lab.plan import evidence as fevidence
from fp8lab.plan.evidence import FP8_ALL_GATHER_STUDY, Evidence
from fp8lab.fp8.recipe import Recipe, kinds_where
from fp8lab.plan import fp8_weights, memory_modes

if TYPE_CHECKING:
    from fp8lab.model.config import ModelConfig
    from fp8lab.plan.config import TrainConfig

# a SageMaker job's plan made at launch (decisions() as JSON), read by fp8lab.train.sm_entry
PLANNED_ENV = "FP8LAB_PLANNED"


@dataclass(frozen=True)
class RunPlan:
    """What a run does: the request (``config``), where (``machine``) and every effective decision.

    ``reasons``: decision name -> why (the ones the plan chose; an explicit option is its own reason)."""

    config: "TrainConfig"
    machine: Machine
    backend: str | None  # None: the plain transformers model
    recipe: Recipe | None  # the backend's FP8 recipe (None without a backend)
    layout: flayout.Layout
    total_steps: int
    warmup_steps: int
    graphs: graphs.Decision
    compute_dtype: str  # torch.autocast dtype of non-FP8 math: bf16 | fp32
    sharded: bool  # FSDP2 really shards (several ranks, --parallel fsdp): the layout's, fp8lab.plan.layout.is_sharded
    master_weights: bool  # bf16 parameters, fp32 masters in the optimizer (fp8lab.train.master_weights)
    streamed_step: bool  # the master weights step a chunk at a time (under CUDA graphs)
    keep_weights: bool  # FSDP2 keeps the weights gathered for the whole step
    weight_cache: bool  # TE's FP8 weight cache: weights cast once per step, not per micro-batch
    fused_wgrad: bool  # TE's weight-gradient GEMMs add into main_grad in place
    # the run's model shape as it is built (a named shape's max_seq_len raised for a longer --seq-len, its
    # --model-override, or a user's folder's config): the trainer, the export and the layout read this one
    model_config: "ModelConfig"
    reasons: dict = field(default_factory=dict)
    fp8_attention: bool = False  # TE's FP8 dot-product attention (fp8lab.plan.fp8attn); also on ``recipe``
    # FSDP2 all-gathers the block linears' weights in FP8 (torchao)
    fp8_all_gather: bool = False
    # FP8 health statistics every K steps (0: off; the rule: fp8lab.plan.fp8_stats)
    fp8_stats_every: int = 0
    fp8_stats_source: str | None = None  # who reads them: fp8lab.fp8.stats.TE_DEBUG or OWN (None: off)
    # the LM head's loss chunked over tokens (fp8lab.train.fused_loss), and the kernel its chunks run (None: off;
    # fp8lab.plan.fused_loss.kernel_for, the kernel whose memory the layout counted)
    fused_loss: bool = False
    fused_loss_kernel: str | None = None
    fp8_lm_head: bool = False  # the LM head's GEMMs in FP8 (fp8lab.plan.fused_loss.fp8_head_decide)
    fp8_primary_weights: bool = False  # the blocks' weights kept only in FP8 (fp8lab.plan.fp8_weights)

    # the layout's values, read where the trainer needs them
    @property
    def fp8(self) -> bool:
        return self.config.precision == "fp8"

    @property
    def fp8_weights(self) -> str | None:
        """How an FP8 run keeps its blocks' weights (fp8lab.plan.fp8_weights); None for a BF16 run."""
        if not self.fp8:
            return None
        return fp8_weights.PRIMARY if self.fp8_primary_weights else fp8_weights.CAST

    @property
    def memory_mode(self) -> str:
        """Bytes of state per parameter (fp8lab.plan.memory_modes): the layout's."""
        return self.layout.memory_mode

    @property
    def world_size(self) -> int:
        return self.machine.world_size

    @property
    def param_dtype(self) -> str:
        return self.layout.param_dtype

    @property
    def seq_len(self) -> int:
        return self.layout.seq_len

    @property
    def micro_batch_size(self) -> int:
        return self.layout.micro_batch_size

    @property
    def grad_accum(self) -> int:
        return self.layout.grad_accum

    @property
    def tokens_per_step(self) -> int:
        return self.layout.tokens_per_gpu_step * self.world_size

    @property
    def backend_label(self) -> str:
        return self.backend or "none"

    @property
    def recipe_kind(self) -> str | None:
        """The FP8 recipe kind that runs (None for BF16 runs and the plain model)."""
        return self.recipe.kind if (self.recipe and self.fp8) else None

    def decisions(self) -> dict[str, Any]:
        """Every effective decision, as plain values (config.json's ``plan``; compared by :meth:`differences`)."""
        return {"backend": self.backend_label, "recipe": self.recipe.describe() if self.recipe else None,
                **self.layout.options(), "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                "cuda_graphs": self.graphs.active, "fp8_weight_cache": self.weight_cache,
                "fuse_wgrad_accumulation": self.fused_wgrad, "master_weights": self.master_weights,
                "streamed_step": self.streamed_step, "memory": self.memory_mode, "compute_dtype": self.compute_dtype,
                "fp8_attention": self.fp8_attention, "fp8_all_gather": self.fp8_all_gather}

    def options(self) -> dict[str, Any]:
        """Every option the plan decides, spelled as the option (config.json's flat keys hold these values: what
        ran, never "auto"). ``recipe``: what ran in FP8 (None for a BF16 run or the plain model)."""
        onoff = {True: "on", False: "off"}
        return {**self.layout.options(), "backend": self.backend_label,
                "recipe": self.recipe.spec() if self.recipe_kind else None, "compute_dtype": self.compute_dtype,
                "cuda_graphs": onoff[bool(self.graphs.active)], "fp8_attention": onoff[self.fp8_attention],
                "fp8_all_gather": onoff[self.fp8_all_gather], "fp8_stats_every": self.fp8_stats_every,
                "fp8_stats_source": self.fp8_stats_source, "fused_loss": onoff[self.fused_loss],
                "memory": self.memory_mode, "fuse": fuses(self.config), "fp8_lm_head": self.fp8_lm_head,
                "fp8_weights": self.fp8_weights}

    def record(self) -> dict[str, Any]:
        """The plan as config.json keeps it: the decisions, why, the machine and the memory estimate."""
        m = self.machine
        return {**self.decisions(), "fp8_stats_every": self.fp8_stats_every,  # what ran, not a job's check
                "fp8_stats_source": self.fp8_stats_source,
                # not among decisions() (a job's FP8LAB_PLANNED has 512 characters), since a job passes the
                # launch's value as --fused-loss on|off (fp8lab.launch.spec) and re-plans nothing of it
                "fused_loss": self.fused_loss, "tokens_per_step": self.tokens_per_step,
                "fused_loss_kernel": self.fused_loss_kernel,  # its chunks' kernel
                # not among decisions() either (that 512): a job re-plans it from the same options and evidence
                "fp8_weights": self.fp8_weights,
                "reasons": self.all_reasons(), "gpu_name": m.name, "world_size": m.world_size,
                "memory_gib": m.memory_gib, "memory_estimate_peak_gib": self.layout.memory.peak,
                "memory_estimate_gib": dataclasses.asdict(self.layout.memory)}

    def all_reasons(self) -> dict[str, str]:
        return {**self.layout.reasons, **self.reasons}

    def differences(self, other: "RunPlan | dict[str, Any]") -> dict[str, tuple[Any, Any]]:
        """decision -> (``other``'s value, this plan's), for those that differ (``other``: a plan or its
        decisions())."""
        theirs = other.decisions() if isinstance(other, RunPlan) else other
        return {k: (theirs[k], v) for k, v in self.decisions().items() if k in theirs and theirs[k] != v}


# ----------------------------------------------------------------------------------------------
# the decisions, one function each
# ----------------------------------------------------------------------------------------------

def select_backend(c: "TrainConfig", machine: Machine) -> tuple[str | None, str]:
    """(the backend that runs, or None for the plain transformers model; why), refusing one not usable here.

    ``--backend auto``: FP8 runs Transformer Engine where it is usable (``machine.te_usable``), else the
    emulator; BF16 runs TE's layers with FP8 off where TE is usable (the fastest BF16 fp8lab has and
    the same layers as the FP8 run), else the plain transformers model."""
    if c.backend == "none":
        return None, "--backend none: the plain transformers model"
    if c.backend == "auto":
        if c.precision == "bf16":
            if machine.te_usable:
                return "te", "auto: Transformer Engine's layers with FP8 off (TE is usable here)"
            return None, "auto: the plain transformers model (Transformer Engine is not usable here)"
        return auto_fp8_backend(machine)
    problem = machine.backend_problem(c.backend)
    if problem is not None:
        raise ValueError(f"--backend {c.backend}: not usable on this machine: {problem}. On a CPU use --backend "
                         "emulated")
    return c.backend, f"--backend {c.backend}"


# the fine-tune loss study (benchmarks/studies/finetune.md; data/results/finetune-h100, finetune-base2-h100,
# finetune-heldout-h100): held-out answer loss against BF16's mean, from three pretrained bases
FINETUNE_EVIDENCE = ("delayed scaling trailed BF16's held-out answer loss by 1.0-1.75% on three pretrained bases, "
                     "current scaling ended 0.5-1.4% below it")


def auto_recipe(task: str, backend: str) -> tuple[Recipe, str]:
    """``--recipe auto``: the backend's default recipe, and why. A fine-tune (``--task sft``) on a backend whose
    default scales from an amax history (delayed scaling) scales each tensor by its current amax instead: in the
    fine-tune loss study delayed scaling fell behind BF16 from step 2 and spiked at step 4 on every seed, while
    current scaling tracked BF16 (``FINETUNE_EVIDENCE``)."""
    default = DEFAULT_RECIPES[backend]
    if task == "sft" and default.row.history:
        return Recipe(kind="current"), f"auto: current scaling for --task sft ({FINETUNE_EVIDENCE})"
    return default, f"auto: {backend}'s default, {default.kind} scaling"


def recipe_for(c: "TrainConfig", backend: str | None) -> tuple[Recipe | None, str]:
    """(the FP8 recipe, why): ``--recipe``, or for ``auto`` the backend's default (:func:`auto_recipe`); None without
    a backend."""
    if backend is None:
        return None, f"--recipe {c.recipe}"
    recipe, why = auto_recipe(c.task, backend) if c.recipe == "auto" else (Recipe.parse(c.recipe),
                                                                           f"--recipe {c.recipe}")
    if c.precision == "fp8":  # refused here, before anything is built: a kind the backend has no recipe for
        if backend == "te":
            if recipe.row.te_class is None:
                raise ValueError(f"--recipe {recipe.kind} is a torchao recipe: use --backend torchao, or on TE "
                                 "--recipe " + " | ".join(kinds_where(lambda r: r.te_class is not None)))
        elif backend == "torchao" and recipe.row.torchao is None:
            raise ValueError("--backend torchao runs --recipe " +
                             " | ".join(kinds_where(lambda r: r.torchao is not None))
                             + f" (torchao scales dynamically, per tensor or per row); {recipe.kind!r} runs on "
                             "--backend te")
    return recipe, why


def fsdp_te_problem(c: "TrainConfig", backend: str | None, distributed: bool,
                    param_dtype: str | None = None) -> str | None:
    """Why this FSDP2 + Transformer Engine layout cannot train, or None (``param_dtype``: the resolved one).

    TE 2.20 under FSDP2 does not keep a high-precision weight it had to cast for backward (it
    expects to re-quantize it there, which only FP8 does): fp32 parameters under bf16 autocast with
    FP8 off fail at the first backward ("GEMM requested the columnwise representation, but it is
    unavailable"). bf16 parameters (FSDP2 gathers them in bf16) need no cast and train.
    """
    param_dtype = param_dtype or c.param_dtype
    if backend == "te" and distributed and c.parallel == "fsdp" and c.precision == "bf16" and param_dtype == "fp32":
        return ("--parallel fsdp with --backend te and --precision bf16 needs --param-dtype bf16: Transformer "
                "Engine under FSDP2 cannot run backward on fp32 parameters cast to bf16 with FP8 off; allowed: "
                "--param-dtype bf16 (fp32 master weights stay in the optimizer), --parallel ddp, or --precision fp8")
    return None


def schedule(c: "TrainConfig", lay: flayout.Layout, world_size: int) -> tuple[int, int]:
    """(optimizer steps, warm-up steps) for the layout ``lay``."""
    tokens_per_step = lay.tokens_per_gpu_step * world_size
    total_steps = c.steps if c.steps is not None else (math.ceil(c.tokens / tokens_per_step) if c.tokens else 100)
    warmup = c.warmup_steps if c.warmup_steps is not None else min(1000, total_steps // 20)
    if warmup >= total_steps:
        raise ValueError(f"--warmup-steps={warmup} is invalid; allowed: fewer than the run's {total_steps} steps")
    return total_steps, warmup


def graphs_decision(c: "TrainConfig", machine: Machine, backend: str | None, lay: flayout.Layout,
                    mcfg) -> graphs.Decision:
    """Whether the run replays its blocks as CUDA graphs (fp8lab.plan.graphs), for its layout."""
    if c.cuda_graphs == "off":
        return graphs.decide("off", None, micro_batch_size=lay.micro_batch_size, seq_len=lay.seq_len)
    memory = flayout.graphs_memory_problem(lay, machine, mcfg, fp8=c.precision == "fp8") if machine.gpu else None
    return graphs.decide(c.cuda_graphs, mcfg, micro_batch_size=lay.micro_batch_size, memory_problem=memory,
                         precision=c.precision, seq_len=lay.seq_len, device_type=machine.device, backend=backend,
                         fuse=fuses(c), param_dtype=lay.param_dtype, world_size=machine.world_size,
                         activation_checkpointing=lay.activation_checkpointing, compile=c.compile,
                         lora=bool(c.lora_rank))


def compute_dtype(c: "TrainConfig", machine: Machine) -> tuple[str, str]:
    if c.compute_dtype != "auto":
        return c.compute_dtype, f"--compute-dtype {c.compute_dtype}"
    return (("bf16", "auto: bf16 autocast on a GPU") if machine.gpu
            else ("fp32", "auto: fp32 on a CPU (bf16 autocast is slow there)"))


def fused_wgrad(c: "TrainConfig", machine: Machine, backend: str | None, master_weights: bool) -> tuple[bool, str]:
    """TE's weight-gradient GEMMs into the masters' main_grad: fused TE layers, master weights, one process
    (DDP all-reduces .grad through hooks that main_grad would bypass)."""
    if not c.fuse_wgrad_accumulation:
        return False, "--fuse-wgrad-accumulation False"
    if c.lora_rank:
        return False, "LoRA: the base is frozen (no weight gradients to add in place)"
    if not (backend == "te" and fuses(c) and master_weights and machine.world_size == 1):
        return False, "needs TE fused layers, --param-dtype bf16 and one process"
    return True, "TE fused layers, bf16 parameters, one process: weight gradients added in place"


def fp8_attention(c: "TrainConfig", machine: Machine, backend: str | None, recipe: Recipe | None,
                  lay: flayout.Layout, mcfg, evidence: Evidence) -> tuple[bool, str]:
    """Whether attention runs in FP8 too (fp8lab.plan.fp8attn's measured rule); ValueError for an ``on`` that cannot
    run."""
    return fp8attn.decide(c.fp8_attention, seq_len=lay.seq_len, evidence=evidence, precision=c.precision,
                          backend=backend, fuse=fuses(c),
                          recipe_kind=recipe.kind if recipe else None, mcfg=mcfg, gpu=machine.gpu,
                          gpu_name=machine.name)


def plan_run(c: "TrainConfig", machine: Machine, evidence: Evidence | None = None) -> RunPlan:
    """Every effective decision of the run ``c`` on ``machine`` given ``evidence`` (default: the packaged one, read
    on the first call); see the module doc. ValueError if it cannot run."""
    evidence = fevidence.load() if evidence is None else evidence
    backend, why_backend = select_backend(c, machine)
    recipe, why_recipe = recipe_for(c, backend)
    if c.backend == "auto":  # an explicit backend was checked with the options (TrainConfig)
        fused_check(c, backend)
    mcfg = c.model_config  # made once, when the options were validated
    kernel = loss_kernel_for(machine)  # the fused loss's chunk kernel: read once, its memory counted by the layout
    # "auto" options -> this machine's layout, the memory mode included (auto uses the modes whose loss check holds)
    lay = flayout.resolve(c, machine, backend, mcfg=mcfg, loss_kernel=kernel, checked_modes=evidence.memory_modes,
                           mode_gaps=dict(evidence.memory_mode_gaps), fp8_head_checked=evidence.fp8_head,
                           fp8_weights_checked=evidence.fp8_weights)
    sharded = lay.sharded  # the layout's (fp8lab.plan.layout.is_sharded)
    problem = fsdp_te_problem(c, backend, machine.world_size > 1, lay.param_dtype)
    if problem:
        raise ValueError(problem)
    total_steps, warmup = schedule(c, lay, machine.world_size)
    decision = graphs_decision(c, machine, backend, lay, mcfg)  # --cuda-graphs on that cannot be captured: refused
    master = lay.param_dtype == "bf16" and not sharded
    keep = bool(sharded and lay.fsdp_keep_weights and lay.grad_accum > 1)
    primary, why_primary = fp8_weights.decide(c.fp8_weights, precision=c.precision, backend=backend, fuse=fuses(c),
                                              memory_mode=lay.memory_mode, lora=bool(c.lora_rank),
                                              checked=evidence.fp8_weights, graphs=bool(decision.active),
                                              ranks=machine.world_size)
    cache, why_cache = flayout.weight_cache(c, backend, grad_accum=lay.grad_accum, sharded=sharded, keep_weights=keep,
                                            memory_mode=lay.memory_mode, fp8_primary=primary)
    wgrad, why_wgrad = fused_wgrad(c, machine, backend, master)
    dtype, why_dtype = compute_dtype(c, machine)
    reasons = {"backend": why_backend, "cuda_graphs": decision.reason,
               "recipe": why_recipe,
               "fp8_weight_cache": why_cache, "fp8_weights": why_primary,
               "fuse_wgrad_accumulation": why_wgrad, "compute_dtype": why_dtype,
               "memory": (lay.reasons.get("memory")
                          or f"--memory {c.memory}: {memory_modes.get(lay.memory_mode).summary}"),
               "master_weights": ("bf16 parameters, fp32 masters in the optimizer" if master else
                                  "FSDP2 keeps fp32 shards" if sharded and lay.param_dtype == "bf16" else
                                  "fp32 parameters"),
               "streamed_step": "under CUDA graphs" if decision.active else "no CUDA graphs: the plain step"}
    # long sequences: a named shape's raised max_seq_len; FP8 attention, carried by the recipe TE runs
    if note := longer_sequence_note(c.model, c.model_overrides, c.seq_len):
        reasons["max_seq_len"] = note
    attn, reasons["fp8_attention"] = fp8_attention(c, machine, backend, recipe, lay, mcfg, evidence)
    if attn:
        recipe = dataclasses.replace(recipe, fp8_attention=True)
    # FP8 all-gather under FSDP2
    fp8_ag, reasons["fp8_all_gather"] = fp8_all_gather_decision(c, backend, sharded, evidence)
    # FP8 health statistics
    stats_every, stats_source, reasons["fp8_stats"] = fp8_stats_decision(c, backend, decision.active, lay.grad_accum,
                                                                         machine, evidence)
    # the fused loss, by the layout's tokens per micro-batch (the rule the layout's estimate used)
    fused, reasons["fused_loss"] = flayout.fused_loss_for(c, machine, mcfg, lay.micro_batch_size * lay.seq_len)
    # the LM head's GEMMs in FP8 (in the chunks where the loss is fused), as the estimate counted them
    if lay.fp8_head:  # (else the layout kept it in BF16, and says why: fp8lab.plan.layout.resolve)
        fp8_head, reasons["fp8_lm_head"] = flayout.fp8_head_for(c, machine, mcfg, fused, c.precision)
        if fp8_head and c.fp8_lm_head == AUTO and not evidence.fp8_head:  # (the layout counted it in BF16 too)
            fp8_head, reasons["fp8_lm_head"] = False, ("auto: off until the FP8 head's GPU check passes "
                                                       "(fp8lab.plan.evidence; --fp8-lm-head True runs it)")
    else:
        fp8_head = False
    if c.fp8_lm_head is True:
        fp8_lm_head_check(backend, fused)
    return RunPlan(c, machine, backend, recipe, lay, total_steps, warmup, decision, dtype, sharded, master,
                   master and (decision.active and lay.memory_mode == memory_modes.PLAIN
                               or memory_modes.get(lay.memory_mode).offloaded), keep, cache, wgrad, mcfg,
                   reasons, fp8_attention=attn,
                   fp8_all_gather=fp8_ag,
                   fp8_stats_every=stats_every, fp8_stats_source=stats_source, fused_loss=fused,
                   fused_loss_kernel=kernel if fused else None, fp8_lm_head=fp8_head, fp8_primary_weights=primary)


# FP8 all-gather under FSDP2 ---------------------------------------------------------------------
# torchao's float8 FSDP2 all-gather (fp8lab.fp8.convert): ``auto`` turns it on only once the GPU check of its gathered
# bytes, dtype and loss is committed and holds (benchmarks/fp8_all_gather_check.py, the evidence's
# ``fp8_all_gather``); ``on`` runs it regardless.


def fp8_all_gather_decision(c: "TrainConfig", backend: str | None, sharded: bool,
                            evidence: Evidence) -> tuple[bool, str]:
    """(FSDP2 all-gathers the block linears' weights in FP8, why); ValueError for ``on`` where it cannot."""
    if c.fp8_all_gather == "off":
        return False, "--fp8-all-gather off"
    per_tensor = c.recipe == "auto" or Recipe.parse(c.recipe).row.per_tensor
    why_not = ("needs --precision fp8" if c.precision != "fp8" else
               "needs --parallel fsdp on several ranks (FSDP2 shards the weights)" if not sharded else
               f"needs per-tensor scaling (torchao all-gathers tensorwise-scaled weights only; --recipe {c.recipe} "
               f"scales per row or block)" if not per_tensor else
               None if backend in FP8_ALL_GATHER_BACKENDS else
               f"needs --backend {' or '.join(FP8_ALL_GATHER_BACKENDS)}: fp8lab wires torchao's float8 FSDP2 "
               f"all-gather; {backend or 'none'} has none here (Transformer Engine's FP8 parameters under FSDP2 are "
               "not wired)")
    if why_not is None:
        if c.fp8_all_gather == "on":
            return True, "--fp8-all-gather on"
        if not evidence.fp8_all_gather:
            return False, ("auto: off until its GPU check is committed (tests/gpu/test_fp8_all_gather_gpu.py); "
                           "--fp8-all-gather on all-gathers the weights in FP8, half the bytes of bf16")
        return True, ("auto: FP8 under FSDP2 on torchao: weights all-gathered in FP8, half the bytes of bf16 "
                      f"(checked on a GPU: {FP8_ALL_GATHER_STUDY})")
    if c.fp8_all_gather == "on":
        raise ValueError(f"--fp8-all-gather on {why_not}; allowed here: auto | off")
    return False, f"auto: off ({why_not})"
