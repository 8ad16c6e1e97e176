"""The layout resolver: a fast batch layout that fits, chosen for the machine a run lands on.

fp8lab's best measured results need a handful of options set together (bf16 parameters with
fp32 master weights, sequence 2048, the largest micro-batch that fits, gradient accumulation,
TE's FP8 weight cache, FSDP2 keeping weights gathered). Every option of that kind defaults to
``"auto"``, and :func:`resolve` turns ``"auto"`` into a value for *this* machine; an explicit
value always wins. The trainer, ``trainpair``/notebook 03 and the SageMaker launcher all call it,
so the command a user types, the notebook's defaults and a planned P5 job get the same layout.

The policy, on a GPU:

* parameters in bf16, fp32 master weights in the optimizer (``--param-dtype bf16``);
* sequence length 2048 (what every measured result uses), at most the model's ``max_seq_len``;
* micro-batch: the largest power of two, up to ``MICRO_BATCH_TOKENS`` tokens per GPU, whose
  estimated peak memory (:func:`estimate_memory`, the larger of the BF16 and FP8 estimates, so
  both precisions get the *same* layout) fits the GPU's memory less a head-room;
* gradient accumulation: ``TOKENS_PER_GPU_STEP`` tokens per GPU per optimizer step (twice that under
  ``--memory offload``, whose host copies cost the same per step), with at most
  ``MAX_GLOBAL_TOKENS_PER_STEP`` over all GPUs and at most ``MAX_GRAD_ACCUM`` micro-batches;
* FSDP2 keeps the weights gathered for the whole step when they fit (``--fsdp-keep-weights``);
* activation checkpointing off, unless no micro-batch fits without it (``--activation-checkpointing``).

On a CPU the small, quick defaults stay (fp32 parameters, sequence 256, micro-batch 4, no
accumulation). A layout whose estimate exceeds the device's memory is refused with the estimate,
before anything is allocated.

The memory model, per GPU, is the largest of four peaks:

* forward/backward: model states (16 bytes per parameter: bf16 parameter and gradient, fp32
  master and two AdamW moments, or the fp32 equivalents; under LoRA that for the adapters only, and the frozen
  base its weights alone; divided by the ranks under FSDP2) + the
  FP8 weight cache (2 bytes per decoder-block weight: FP8 copy and its transpose) + kept bf16
  weights under FSDP2 + activations + 1 GiB of workspace;
* optimizer step: 18 bytes per parameter with bf16 parameters (the fp32 master gradients exist
  while the bf16 ones are freed one by one). Under CUDA graphs the step is streamed and the graphs
  hold activations for the whole run: :func:`graphs_memory_problem` has that model;
* validation: the states + the loss's logits of one micro-batch read in fp32 (with the fused loss, one
  no-grad chunk, cut to a training chunk's memory) + one block's forward. Below the training peak
  wherever the layout fits, it is counted so that the final evaluation never meets a wall the
  training steps did not (under CUDA graphs, the graphed peaks measured with their evaluation bound it);
* the build, before any of them: each rank builds the whole model in fp32 and converts it on its GPU
  (:func:`build_bytes`). It binds where the states are small beside the weights: LoRA on a 7-8B model.

Activations per token: ``a * L * (7h + 3 kv + k f) + b * V`` bytes, with ``k`` = 3 for SwiGLU
(gate, up, product) and 2 for GELU, ``kv`` = key/value width; ``a`` and ``b`` were fitted to the
measured peaks of TE fused runs (llama-1b and llama-7b, one H200) and are checked against every
measured TE run in ``tests/unit/test_layout.py`` (within 10%). Per token means linear in the sequence:
attention runs as fused (flash / cuDNN) kernels that keep O(seq) softmax statistics, never the seq x seq
scores, and the logits are O(seq x vocab). So long sequences (4K-16K) trade micro-batch for
length at the same tokens per micro-batch; where even micro-batch 1 does not fit, ``--activation-checkpointing
auto`` keeps only each block's input (2 bytes x hidden per token and layer) plus one block's activations,
for both precisions of a pair alike; the logits stay (a 128K vocabulary at 16K tokens: ~30 GiB).
With the fused loss (``--fused-loss``, fp8lab.train.fused_loss) the ``b * V`` term per token is replaced by
one chunk's logits and the fp32 weight-gradient sum (``fp8lab.plan.fused_loss.loss_bytes``), for both precisions alike.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from fp8lab.core.hardware import Machine
from fp8lab.core.validate import AUTO  # "auto": what the resolver picks per machine
from fp8lab.model import families
from fp8lab.model.models import block_matmul_params, count_parameters
from fp8lab.plan.fused_loss import NO_GRAD_BYTES_PER_LOGIT, chunk_tokens, loss_bytes, no_grad_loss_bytes
from fp8lab.plan.fused_loss import decide as fused_loss_decide, fp8_head_decide, kernel_for as loss_kernel_for
from fp8lab.plan import fp8_weights, memory_modes
from fp8lab.plan.lora import fuses
from fp8lab.plan.lora import adapted as lora_adapted, shapes as lora_shapes, trainable_params as lora_trainable

GPU_SEQ_LEN = 2048
CPU_SEQ_LEN, CPU_MICRO_BATCH = 256, 4  # quick CPU defaults (tests, notebooks on a laptop)
MICRO_BATCH_TOKENS = 32_768  # largest micro-batch considered, tokens per GPU (16 x 2048: GEMMs are large by then)
TOKENS_PER_GPU_STEP = 131_072  # target tokens per optimizer step per GPU (the best measured 1B layout: 16 x 2048 x 4)
# --memory offload moves its states over PCIe once per step (~24 bytes per parameter: ~2 s at 7B, whatever the tokens):
# twice the tokens per step halve that fixed cost's share, still far below Llama 2's batch
OFFLOAD_TOKENS_PER_GPU_STEP = 2 * TOKENS_PER_GPU_STEP
MAX_GLOBAL_TOKENS_PER_STEP = 4 * 2**20  # at most ~4M tokens per optimizer step over all GPUs (Llama 2's batch)
MAX_GRAD_ACCUM = 32  # short sequences or tiny micro-batches do not get hundreds of micro-steps
HEADROOM_GIB, HEADROOM_FRACTION = 5.0, 0.05  # kept free: the larger of the two
WORKSPACE_GIB = 1.0  # cuBLAS/cuDNN workspaces, allocator slack (GPUs only)
# fp32 gradient bytes converted and stepped at a time by the streamed step (fp8lab.train.master_weights)
STREAM_CHUNK_BYTES = 1 << 30
# fp32 gradient bytes of a chunk of the offloaded step (--memory offload; what it holds on the GPU: offload_step_bytes)
OFFLOAD_CHUNK_BYTES = 1 << 28
HOST_SHARE = 0.85  # of a process's host memory that offloaded states may take (the process, data and OS need the rest)
# activation bytes per unit (see the module docstring), by what computes the blocks' GEMMs
ACT_BYTES = {"bf16": 1.80, "fp8": 1.627}
LOGIT_BYTES = {"bf16": 16.2, "fp8": 15.6}
HF_EAGER_FACTOR = 1.55  # plain transformers blocks keep more (measured: llama-1b 57.6 vs 41.3 GiB)
FP32_FACTOR = 2.0  # activations in fp32 (CPU runs, --compute-dtype fp32)

# options whose "auto" the resolver decides (TrainConfig field names)
INT_FIELDS = ("seq_len", "micro_batch_size", "grad_accum")  # integers or "auto"
AUTO_FIELDS = ("param_dtype", *INT_FIELDS, "fsdp_keep_weights",
               "activation_checkpointing")  # a layout decision like the others (Layout.options, JobSpec pins it)


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated peak GPU memory of one rank, in GiB, by part."""

    states: float  # parameters, gradients, master weights, AdamW moments (this rank's share)
    fp8_cache: float  # TE's FP8 weight copies kept for the step
    kept_weights: float  # FSDP2: unsharded bf16 weights kept for the step
    activations: float  # saved for backward, for one micro-batch (incl. logits and loss)
    step: float  # peak of the optimizer step (master gradients)
    workspace: float = WORKSPACE_GIB
    # validation's working set on top of the states: the loss's logits of one micro-batch (or one no-grad chunk of
    # the fused loss) read in fp32, and one block's forward (nothing is saved for a backward)
    evaluation: float = 0.0
    build: float = 0.0  # the model's build and conversion, before training allocates anything (build_bytes)
    host: float = 0.0  # host memory the states kept there take (--memory offload), not GPU memory

    @property
    def train(self) -> float:
        return self.states + self.fp8_cache + self.kept_weights + self.activations + self.workspace

    @property
    def validation(self) -> float:
        """Peak of a validation pass: the states stay (the FP8 weight cache is released after each step)."""
        return self.states + self.kept_weights + self.evaluation + self.workspace

    @property
    def peak(self) -> float:
        return max(self.train, self.step + self.workspace, self.validation, self.build)

    def describe(self) -> str:
        return (f"{self.peak:.{0 if self.peak >= 10 else 2}f} GiB (states {self.states:.1f}, activations "
                f"{self.activations:.1f}"
                + (f", FP8 weight cache {self.fp8_cache:.1f}" if self.fp8_cache else "")
                + (f", kept weights {self.kept_weights:.1f}" if self.kept_weights else "")
                + (f"; in host memory {self.host:.1f}" if self.host else "")
                + (f"; the build's peak binds: {self.build:.1f}" if self.build >= self.peak else "") + ")")


def is_sharded(parallel: str, world_size: int) -> bool:
    """FSDP2 really shards the model states: ``--parallel fsdp`` on several ranks (one process trains unsharded).
    The one rule: the resolver records it on the :class:`Layout` (``Layout.sharded``, ``RunPlan.sharded``)."""
    return parallel == "fsdp" and world_size > 1


def _act_unit(mcfg) -> int:
    kv = mcfg.kv_heads * mcfg.head_dim
    k = 3 if mcfg.family == "llama" else 2
    return 7 * mcfg.hidden_size + 3 * kv + k * mcfg.intermediate_size


def _fused_gemms(mcfg) -> dict[str, tuple[int, int, int]]:
    """Each GEMM of a fused block (families.PROJECTIONS): (its input's width, its output rows, how many projections
    it joins), from the projections' shapes (fp8lab.plan.lora.shapes)."""
    out: dict[str, tuple[int, int, int]] = {}
    for name, (gemm, _) in families.PROJECTIONS[mcfg.family].items():
        width, rows = lora_shapes(mcfg)[name]
        _, joined_rows, joined = out.get(gemm, (width, 0, 0))
        out[gemm] = (width, joined_rows + rows, joined + 1)
    return out


def _lora_fused_bytes(mcfg, targets: tuple[str, ...], dropout: bool, kind: str) -> int:
    """Activation bytes per token and block that LoRA's adapters on the fused blocks add (``kind``: the GEMMs'
    precision, ACT_BYTES's key). The adapters keep the inputs of the GEMMs they adapt (norms' outputs, the
    attention's and the activation's outputs) in bf16 where the frozen GEMMs keep none: in FP8 a byte each beyond the
    FP8 copy a trained GEMM keeps (which ACT_BYTES counts), in BF16 nothing beyond the bf16 copy it keeps. With
    dropout each adapter keeps its own dropped copy and mask (3 bytes). The split MLP's SwiGLU (TE's kernels) keeps
    fc1's output alone, as LayerNormMLP does."""
    gemm_input = {g: width for g, (width, _, _) in _fused_gemms(mcfg).items()}
    gemms = [families.PROJECTIONS[mcfg.family][n][0] for n in targets]  # one per adapter
    kept = sum(gemm_input[g] for g in set(gemms)) if kind == "fp8" else 0
    dropped = 3 * sum(gemm_input[g] for g in gemms) if dropout else 0
    return kept + dropped


def build_bytes(mcfg, *, backend: str | None, fuse: bool) -> int:
    """Peak bytes of building one rank's model, before training allocates anything: each rank builds the whole
    model in fp32 on its device (fp8lab.model.build_model) and converts it there. Fused blocks are made beside the
    HF model, which lives until they hold its weights, copied in one fused weight at a time (each joined one, q|k|v
    or gate|up, made and freed in turn: the largest counts); TE's module swap makes each ``te.Linear`` beside the
    ``nn.Linear`` it replaces, and the old ones stay referenced until the swap ends (measured on one H100,
    Llama-3.1-8B: 55.95 GiB, this count 55.9; finetune-h100 ABOUT.md)."""
    n = count_parameters(mcfg).total
    if backend in ("te", "emulated") and fuse:  # the emulator builds its fused blocks the same way
        joined = max((w * rows for w, rows, parts in _fused_gemms(mcfg).values() if parts > 1), default=0)
        return 4 * (2 * n + joined)
    if backend == "te":
        return 4 * (n + _block_linear_params(mcfg))
    return 4 * n


def _block_linear_params(mcfg) -> int:
    """GEMM weights of all decoder blocks (fp8lab.model.models.block_matmul_params per block)."""
    return mcfg.num_layers * block_matmul_params(mcfg)


def offload_step_bytes(mcfg, trainable: int) -> int:
    """GPU bytes the offloaded step adds (fp8lab.train.master_weights): two staging slots of a chunk's fp32 masters and
    moments (12 bytes per parameter each), the chunk's fp32 gradients (4) and, at the first step, the moments AdamW
    makes before they go to the host (8). A chunk holds at most OFFLOAD_CHUNK_BYTES of gradients, or the one larger
    tensor (the embedding: vocabulary x hidden)."""
    chunk = min(trainable, max(OFFLOAD_CHUNK_BYTES // 4, mcfg.vocab_size * mcfg.hidden_size))
    return (2 * 12 + 4 + 8) * chunk


def estimate_memory(mcfg, *, precision: str, micro_batch_size: int, seq_len: int, param_dtype: str = "bf16",
                    backend: str | None = "te", fuse: bool = True, world_size: int = 1, parallel: str = "ddp",
                    keep_weights: bool = False, weight_cache: bool = False, activation_checkpointing: bool = False,
                    fp32_activations: bool = False, workspace_gib: float = WORKSPACE_GIB,
                    fused_loss: bool = False, loss_kernel: str = "compiled",
                    memory_mode: str = memory_modes.PLAIN, trainable: int | None = None,
                    fp8_head: bool = False, lora: tuple[tuple[str, ...], bool] | None = None,
                    fp8_primary: bool = False) -> MemoryEstimate:
    """Peak memory of one rank for this layout (see the module docstring for the model); ``fused_loss``: the
    LM head's loss chunked (fp8lab.train.fused_loss), so a chunk's logits instead of the micro-batch's, held as
    ``loss_kernel`` holds them (fp8lab.plan.fused_loss.KERNELS), with ``fp8_head`` its GEMMs in FP8. ``trainable``:
    the parameters that train beside a frozen base (LoRA's adapters, fp8lab.plan.lora), None: every one. A frozen
    parameter is only its weight (2 or 4 bytes): no gradient, master or AdamW moments. ``lora``: (the projections
    adapted, with dropout or not; fp8lab.plan.lora.adapted), whose adapters on TE's fused blocks keep their inputs.
    ``fp8_primary``: the blocks' weights kept only in FP8 (fp8lab.plan.fp8_weights), a byte each instead of two."""
    n = count_parameters(mcfg).total
    t = n if trainable is None else trainable
    frozen = 0 if trainable is None else n
    sharded = is_sharded(parallel, world_size)
    gib = 2.0**30
    shard = world_size if sharded else 1
    mode = memory_modes.get(memory_mode)
    # a frozen weight: bf16 where bf16 parameters are kept (one process / DDP), FSDP2's fp32 shard otherwise
    states = (mode.state_bytes * t + (2 if param_dtype == "bf16" and not sharded else 4) * frozen) / shard
    if parallel == "ddp" and world_size > 1:
        states += (2 if param_dtype == "bf16" else 4) * t  # DDP's gradient buckets
    if mode.fused_adam:  # FusedAdam steps in place; FP8 moments are read as fp32 one parameter group at a time
        step = states + (STREAM_CHUNK_BYTES if "fp8" in (mode.exp_avg, mode.exp_avg_sq) else 0)
    elif mode.offloaded:
        step = states + offload_step_bytes(mcfg, t)
    else:
        step = (states + 2 * t / shard) if param_dtype == "bf16" else states
    kept = 2 * n if (sharded and keep_weights) else 0.0
    fp8 = precision == "fp8" and backend == "te"
    if fp8 and fp8_primary:  # the transposes a backward makes are dropped after it, as the activations go
        states -= _block_linear_params(mcfg) / shard
    cache = 2 * _block_linear_params(mcfg) if (fp8 and weight_cache and (keep_weights or not sharded)) else 0.0
    if fp8 and mode.fused_adam and not activation_checkpointing:
        # no cache in a memory mode, but each block's FP8 weights (and transposes) are saved for its backward: all of
        # them at the end of the forward (measured: llama-7b at 1 x 2048 ran out of 79 GiB with 73 allocated);
        # checkpointing recomputes them block by block
        cache = 2 * _block_linear_params(mcfg)
    kind = "fp8" if fp8 else "bf16"
    per_layer = ACT_BYTES[kind] * _act_unit(mcfg)
    if backend is None or (backend == "te" and not fuse) or backend == "emulated":
        per_layer *= HF_EAGER_FACTOR
    elif lora is not None and backend == "te":  # LoRA on the fused blocks (fp8lab.train.lora): what adapters keep
        per_layer += _lora_fused_bytes(mcfg, *lora, kind)
    layers = mcfg.num_layers * per_layer
    if activation_checkpointing:  # block inputs kept, one block recomputed at a time
        layers = mcfg.num_layers * 2 * mcfg.hidden_size + per_layer
    per_token = layers + (0.0 if fused_loss else LOGIT_BYTES[kind] * mcfg.vocab_size)
    if fp32_activations:
        per_token *= FP32_FACTOR
    tokens = micro_batch_size * seq_len
    acts = per_token * tokens
    widen = FP32_FACTOR if fp32_activations else 1.0
    if fused_loss:  # one chunk's logits and gradient, and the fp32 sum of the head's weight gradient
        acts += loss_bytes(vocab=mcfg.vocab_size, hidden=mcfg.hidden_size,
                           tokens_per_micro_batch=tokens, kernel=loss_kernel, fp8_head=fp8_head) * widen
        val_loss = no_grad_loss_bytes(vocab=mcfg.vocab_size, tokens_per_micro_batch=tokens, kernel=loss_kernel,
                                      fp8_head=fp8_head) * widen
    else:
        val_loss = NO_GRAD_BYTES_PER_LOGIT * mcfg.vocab_size * tokens * widen
    evaluation = val_loss + per_layer * tokens * widen
    return MemoryEstimate(states / gib, cache / gib, kept / gib, acts / gib, step / gib, workspace_gib,
                          evaluation / gib, build_bytes(mcfg, backend=backend, fuse=fuse) / gib,
                          mode.host_bytes * t / gib)


@dataclass(frozen=True)
class Layout:
    """What the resolver chose, the memory estimate behind it, and why (option -> reason)."""

    param_dtype: str
    seq_len: int
    micro_batch_size: int
    grad_accum: int
    fsdp_keep_weights: bool
    memory: MemoryEstimate
    machine: Machine
    reasons: dict = dataclasses.field(default_factory=dict)
    activation_checkpointing: bool = False  # recompute each block in backward (--activation-checkpointing, or auto)
    sharded: bool = False  # FSDP2 really shards (is_sharded: --parallel fsdp on several ranks)
    memory_mode: str = memory_modes.PLAIN  # bytes of state per parameter (fp8lab.plan.memory_modes)
    # False: this layout kept the LM head in BF16 under --fp8-lm-head auto (FP8 would change it or not fit); True
    # says only that the layout did not (the plan decides the head: fp8lab.plan.runplan)
    fp8_head: bool = True

    @property
    def tokens_per_gpu_step(self) -> int:
        return self.micro_batch_size * self.seq_len * self.grad_accum

    def options(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in AUTO_FIELDS}

    def header(self) -> str:
        """One line for the run's log: the layout, and why where the resolver chose."""
        m = self.machine
        where = f"{m.memory_gib:.0f} GiB of {m.name}" if m.gpu else f"{m.memory_gib:.0f} GiB of RAM"
        why = "; ".join(f"{v}" for v in self.reasons.values())
        return (f"layout: micro-batch {self.micro_batch_size} x {self.seq_len} tokens, accumulation {self.grad_accum} "
                f"({self.tokens_per_gpu_step:,} tokens/GPU/step), {self.param_dtype} parameters"
                + (", FSDP2 keeps weights gathered" if self.fsdp_keep_weights else "")
                + (", activation checkpointing" if self.activation_checkpointing else "")
                + (f", --memory {self.memory_mode}" if self.memory_mode != memory_modes.PLAIN else "")
                + f"; memory estimate {self.memory.describe()} of {where}" + (f" | auto: {why}" if why else ""))


def fixed_gib(e: MemoryEstimate) -> float:
    """What no batch layout changes: the model states (and the FP8 cache, kept weights and workspace beside them),
    or the optimizer step's peak, whichever is larger."""
    return max(e.states + e.fp8_cache + e.kept_weights + e.workspace, e.step + e.workspace)


def remedies(e: MemoryEstimate, budget: float, *, sharded: bool, ckpt_tried: bool, explicit_batch: bool = False) -> str:
    """The remedies that change the term that does not fit: where the states alone exceed ``budget`` GiB, only fewer
    states per GPU help (sharding them over more GPUs, a larger GPU); otherwise less activation memory does too."""
    fsdp = ("more GPUs with --parallel fsdp (shards the model states)" if not sharded else "more GPUs (FSDP2 shards "
            "the states over them)")
    if e.build > budget and e.build >= fixed_gib(e):
        return (f"building the model alone needs {e.build:.0f} GiB of the {budget:.0f} usable (each GPU builds it "
                "whole in fp32 and converts it), which no batch layout, sequence length, activation checkpointing "
                "or sharding changes; allowed: a GPU with more memory")
    if fixed_gib(e) > budget:
        return (f"the model states alone need {fixed_gib(e):.0f} GiB of the {budget:.0f} usable, which no batch "
                f"layout, sequence length or activation checkpointing changes; allowed: {fsdp}, or a GPU with more "
                "memory")
    batch = ("a smaller --micro-batch-size or --seq-len (or 'auto' for the largest that fits), " if explicit_batch
             else "a shorter --seq-len, ")
    return ("allowed: " + batch + ("" if ckpt_tried else "--activation-checkpointing, ") + f"{fsdp}, or a larger GPU")


def _budget(machine: Machine) -> float:
    return machine.memory_gib - max(HEADROOM_GIB, HEADROOM_FRACTION * machine.memory_gib)


GRAPH_HOLD_FACTOR = 1.25  # margin on the activations CUDA graphs keep for the whole run (see graphs_memory_problem)


def _graphs_base(layout: "Layout") -> float:
    """What a graphed run needs besides what its graphs hold: model states, one streamed chunk, workspace. (Its
    validation pass runs the eager blocks beside the graphs' pools; the measured graphed peaks this rule is checked
    against include each run's final evaluation, within GRAPH_HOLD_FACTOR's margin.)"""
    m = layout.memory
    chunk = m.step - m.states if memory_modes.get(layout.memory_mode).offloaded else STREAM_CHUNK_BYTES / 2**30
    return m.states + m.kept_weights + chunk + m.workspace


def _graphs_held(layout: "Layout", mcfg, fp8: bool) -> float:
    """What the graphs hold for the whole run: the activations with the margin and, in FP8, the FP8 weights
    (two bytes per block weight: the quantised copy and its transpose, a known size, so no margin)."""
    return GRAPH_HOLD_FACTOR * layout.memory.activations + (2 * _block_linear_params(mcfg) / 2**30 if fp8 else 0.0)


def _graphs_budget(machine: Machine) -> float:
    """GiB a graphed layout may reserve: the rule is fitted to measured peaks of *reserved* memory (the
    allocator's fragmentation included), so it keeps only the fixed headroom for what torch's allocator
    does not see, not the fraction that covers fragmentation above an estimate of allocated memory."""
    return machine.memory_gib - HEADROOM_GIB


def graphs_memory_need(layout: "Layout", mcfg, fp8: bool) -> float:
    """Peak GiB of this layout with its decoder blocks captured as CUDA graphs (see graphs_memory_problem)."""
    return _graphs_base(layout) + _graphs_held(layout, mcfg, fp8)


def graphs_memory_problem(layout: "Layout", machine: Machine, mcfg, fp8: bool) -> str | None:
    """Why this layout would not fit with its decoder blocks captured as CUDA graphs (None: it fits).

    A graph keeps what its blocks allocate (saved activations and, under FP8, the quantised weights
    saved for backward) in its own memory pool for the whole run, where an eager step frees them
    before the optimizer step. Under graphs the trainer's master weights run their streamed step
    (``fp8lab.train.master_weights``): the step needs one chunk of fp32 gradients, not a full copy. Estimate:
    the model states + one chunk + workspace + GRAPH_HOLD_FACTOR x activations + the FP8 weights, against
    the GPU's memory less HEADROOM_GIB (``_graphs_budget``). The measured peaks it was fitted to, and how close
    its estimates came: ``benchmarks/studies/cuda_graphs.md`` (``data/results/graphs-h200/``)."""
    held = _graphs_held(layout, mcfg, fp8)
    need = _graphs_base(layout) + held
    budget = _graphs_budget(machine)
    if need <= budget:
        return None
    return (f"with the blocks captured the run would need about {need:.1f} GiB (the graphs hold "
            f"{held:.1f} GiB for the whole run) of {budget:.1f} GiB usable on {machine.name}")


def weight_cache(c, backend: str | None, *, grad_accum: int, sharded: bool, keep_weights: bool,
                 precision: str | None = None, memory_mode: str = memory_modes.PLAIN,
                 fp8_primary: bool = False) -> tuple[bool, str]:
    """(whether TE's FP8 weight cache is built, why): the one rule the trainer (fp8lab.plan.runplan) and the memory
    estimate follow. The first micro-batch of a step quantises the weights, the others reuse them (they
    cannot change before the optimizer step); under FSDP2 only with the weights kept gathered for the
    whole step (the layout tested on two GPUs), not with per-micro-batch gathers."""
    if not c.fp8_weight_cache:
        return False, "--fp8-weight-cache False"
    if (precision or c.precision) != "fp8" or backend != "te" or not fuses(c):
        return False, "only FP8 runs on TE's fused layers cache FP8 weights"
    if fp8_primary:
        return False, "the blocks' weights are FP8 already (--fp8-weights primary): nothing to cast or cache"
    if memory_modes.get(memory_mode).fused_adam:
        return False, f"--memory {memory_mode}: FP8 weights cast per micro-batch (the cache's memory goes first)"
    if grad_accum <= 1:
        return False, "accumulation 1: no later micro-batch to reuse the FP8 weights"
    if sharded and not keep_weights:
        return False, "FSDP2 without kept weights gathers them per micro-batch"
    return True, f"FP8 weights cast once per step, reused by {grad_accum - 1} more micro-batches"


def fused_loss_for(c, machine: Machine, mcfg, tokens_per_micro_batch: int) -> tuple[bool, str]:
    """(the fused loss runs, why) at this micro-batch (fp8lab.plan.fused_loss.decide: the plan's rule, the estimate's
    too)."""
    return fused_loss_decide(c.fused_loss, vocab=mcfg.vocab_size, tokens_per_micro_batch=tokens_per_micro_batch,
                             gpu=machine.gpu)


def fp8_head_for(c, machine: Machine, mcfg, fused: bool, precision: str) -> tuple[bool, str]:
    """(the LM head's GEMMs run in FP8, why) for a run in ``precision`` (fp8lab.plan.fused_loss.fp8_head_decide: the
    plan's rule, the estimate's too)."""
    return fp8_head_decide(c.fp8_lm_head, precision=precision, fused=fused, fp8_gemms=machine.gpu and machine.fp8,
                           vocab=mcfg.vocab_size, hidden=mcfg.hidden_size, gpu=machine.gpu)


def _estimate_for(mcfg, c, machine: Machine, backend: str | None, param_dtype: str, mb: int, seq: int, ga: int,
                  keep: bool, both_precisions: bool, activation_checkpointing: bool = False,
                  sharded: bool = False, loss_kernel: str = "compiled",
                  memory_mode: str = memory_modes.PLAIN) -> MemoryEstimate:
    """The estimate of this layout; with ``both_precisions`` the larger of BF16 and FP8 (one layout for both;
    the fused loss, decided by vocabulary and tokens alone, is the same for both)."""
    fused = fused_loss_for(c, machine, mcfg, mb * seq)[0]
    precisions = ("bf16", "fp8") if (both_precisions and backend == "te") else (c.precision,)

    def primary(p: str) -> bool:
        return fp8_weights.applies(c.fp8_weights, precision=p, backend=backend, fuse=fuses(c),
                                   memory_mode=memory_mode, lora=bool(c.lora_rank), ranks=machine.world_size)

    ests = [estimate_memory(mcfg, precision=p, micro_batch_size=mb, seq_len=seq, param_dtype=param_dtype,
                            backend=backend, fuse=fuses(c), world_size=machine.world_size, parallel=c.parallel,
                            keep_weights=keep,
                            weight_cache=weight_cache(c, backend, grad_accum=ga, sharded=sharded, keep_weights=keep,
                                                      precision=p, memory_mode=memory_mode,
                                                      fp8_primary=primary(p))[0],
                            activation_checkpointing=activation_checkpointing,
                            fp32_activations=not machine.gpu or c.compute_dtype == "fp32",
                            workspace_gib=WORKSPACE_GIB if machine.gpu else 0.0, fused_loss=fused,
                            loss_kernel=loss_kernel, memory_mode=memory_mode,
                            trainable=lora_trainable(c, mcfg), lora=lora_adapted(c, mcfg),
                            fp8_head=fp8_head_for(c, machine, mcfg, fused, p)[0], fp8_primary=primary(p))
            for p in precisions]
    return max(ests, key=lambda e: e.peak)


def resolve(c, machine: Machine, backend: str | None, mcfg=None, loss_kernel: str | None = None,
            checked_modes: tuple[str, ...] = (), mode_gaps: dict[str, float] | None = None,
            fp8_head_checked: bool = True, fp8_weights_checked: bool = False) -> Layout:
    """:func:`resolve_mode` for each memory mode ``--memory`` allows, in order (fp8lab.plan.memory_modes.candidates;
    ``checked_modes``: the modes whose loss check holds; ``mode_gaps``: each checked mode's measured loss gap to plain,
    in percent): the first layout that fits. Raises ValueError when none does, naming the modes tried.

    Under ``--fp8-lm-head auto`` the layout is the one the head in BF16 gets: where the LM head's GEMMs in FP8 (their
    weight copies and the gradient's E5M2 copy) would change it (a smaller micro-batch, checkpointing, a memory mode)
    or not fit, the head stays in BF16 (``Layout.fp8_head`` False, with the reason): the layout first, then the
    head's few percent of speed. ``fp8_head_checked`` False (its GPU check not passed: fp8lab.plan.evidence): auto
    plans the head in BF16. ``fp8_weights_checked``: ``--fp8-weights auto`` counts the blocks' weights only in FP8
    where they can be (fp8lab.plan.fp8_weights.resolved)."""
    if c.fp8_weights == AUTO and fp8_weights_checked:  # (the layout keeps no config: the plan records "auto")
        c = dataclasses.replace(c, fp8_weights=fp8_weights.resolved(AUTO, fp8_weights_checked))
    args = (machine, backend, mcfg, loss_kernel, checked_modes, mode_gaps)
    if c.fp8_lm_head != AUTO:
        return _resolve_modes(c, *args)
    if not fp8_head_checked:  # (not the layout's choice: Layout.fp8_head stays True; the plan says why)
        return _resolve_modes(dataclasses.replace(c, fp8_lm_head=False), *args)
    try:
        lay = _resolve_modes(c, *args)
    except ValueError:
        lay = None
    bf16_head = _resolve_modes(dataclasses.replace(c, fp8_lm_head=False), *args)  # raises where nothing fits
    more = lay is not None and _more_chunks(c, lay, mcfg or c.model_config, loss_kernel)
    if lay is not None and _shape(lay) == _shape(bf16_head) and not more:
        return lay
    if lay is None:
        why = "no layout fits"
    elif more:
        why = (f"the loss would run in {more[1]} chunks instead of {more[0]} (a precaution: Qwen2.5-1.5B laid out "
               "so on one H200 was no faster, -1.0%, data/results/fp8-head-chunks-h200)")
    else:
        why = "the layout would change (" + ", ".join(
            f"{k} {a} -> {b}" for k, a, b in zip(SHAPE_FIELDS, _shape(bf16_head), _shape(lay)) if a != b) + ")"
    bf16_head.reasons["fp8_lm_head"] = ("auto: off: with the LM head's GEMMs in FP8 in an FP8 run (two FP8 copies of "
                                        f"its weight, the gradient's E5M2 copy) {why}")
    return dataclasses.replace(bf16_head, fp8_head=False)


def _more_chunks(c, lay: Layout, mcfg, loss_kernel: str | None) -> tuple[int, int] | None:
    """(chunks with the head in BF16, in FP8) where the FP8 head's byte per logit would cut the fused loss into
    more chunks than the BF16 head's, else None."""
    tokens = lay.micro_batch_size * lay.seq_len
    fused = fused_loss_for(c, lay.machine, mcfg, tokens)[0]
    if not (fused and fp8_head_for(c, lay.machine, mcfg, fused, "fp8")[0]):  # (the pair's FP8 run: one layout)
        return None
    kernel = loss_kernel or loss_kernel_for(lay.machine)
    n = [math.ceil(tokens / chunk_tokens(mcfg.vocab_size, tokens, kernel, fp8)) for fp8 in (False, True)]
    return (n[0], n[1]) if n[1] > n[0] else None


SHAPE_FIELDS = ("micro_batch_size", "grad_accum", "seq_len", "activation_checkpointing", "fsdp_keep_weights",
                "memory_mode")


def _shape(lay: Layout) -> tuple:
    return tuple(getattr(lay, k) for k in SHAPE_FIELDS)


def _resolve_modes(c, machine: Machine, backend: str | None, mcfg=None, loss_kernel: str | None = None,
                   checked_modes: tuple[str, ...] = (), mode_gaps: dict[str, float] | None = None) -> Layout:
    mcfg = mcfg or c.model_config
    param_dtype = c.param_dtype if c.param_dtype != AUTO else ("bf16" if machine.gpu else "fp32")
    where = dict(gpu=machine.gpu, sharded=is_sharded(c.parallel, machine.world_size), param_dtype=param_dtype,
                 backend=backend)
    modes, why_plain = memory_modes.candidates(c.memory, checked=checked_modes, **where)
    refusals = []
    for mode in modes:
        try:
            lay = resolve_mode(c, machine, backend, mcfg, loss_kernel, mode)
        except ValueError as e:
            refusals.append((mode, str(e)))
            continue
        if c.memory == AUTO and mode != memory_modes.PLAIN:
            tried = ", ".join(m for m, _ in refusals)
            lay.reasons["memory"] = (f"--memory {mode}: {c.model} fits {machine.name} with "
                                     f"{memory_modes.get(mode).state_bytes} bytes of state per parameter "
                                     f"({tried} did not fit)")
        return lay
    hint = ""
    if c.memory == AUTO and not why_plain:  # a mode whose loss check is not committed, where it would fit
        fits = [m for m in memory_modes.NAMES if m not in modes and not memory_modes.problem(m, **where)
                and _fits(c, machine, backend, mcfg, loss_kernel, m)]
        if fits:
            gap = (mode_gaps or {}).get(fits[0])
            why = (f"its loss check did not pass ({gap:+.2f}% from the plain mode's loss)" if gap is not None
                   else "auto uses it once its loss check is committed")
            hint = f"; --memory {fits[0]} fits ({memory_modes.get(fits[0]).summary}), asked for by name: {why}"
    if len(refusals) == 1:
        raise ValueError(refusals[0][1] + hint)
    first = refusals[0][1]
    tried = "; ".join(f"{m}: {msg.split('estimated peak ')[-1].split(';')[0]}" for m, msg in refusals[1:])
    raise ValueError(f"{first} (memory modes tried: {', '.join(m for m, _ in refusals)}; {tried}){hint}")


def _check_host(c, machine: Machine, memory_mode: str, e: MemoryEstimate) -> None:
    """ValueError where the states a mode keeps in host memory do not fit the host's share for this GPU; where that
    share is not known, ``auto`` does not take the mode (asked for by name, it runs)."""
    if not e.host:
        return
    # an export (--save-model) copies each master out of the shared buffer beside them: 4 more bytes per parameter
    need = e.host * (1 + 4 / memory_modes.get(memory_mode).host_bytes) if c.save_model else e.host
    host = machine.host_memory_gib
    if host is None:
        if c.memory == AUTO:
            raise ValueError(f"--memory {memory_mode}: the host memory of {machine.name} is not known, and its states "
                             f"take {need:.0f} GiB there; auto takes it only where they are known to fit")
        return
    if need > HOST_SHARE * host:
        export = " with the export's copy (--save-model)" if c.save_model else ""
        raise ValueError(f"--memory {memory_mode}: its states take {need:.0f} GiB of host memory{export}, more than "
                         f"{HOST_SHARE:.0%} of the {host:.0f} GiB this GPU's process has; remedies: a machine with "
                         "more host memory, or another --memory mode" + (", or --save-model False" if export else ""))


def _fits(c, machine: Machine, backend: str | None, mcfg, loss_kernel: str | None, mode: str) -> bool:
    try:
        resolve_mode(c, machine, backend, mcfg, loss_kernel, mode)
    except ValueError:
        return False
    return True


def resolve_mode(c, machine: Machine, backend: str | None, mcfg=None, loss_kernel: str | None = None,
                 memory_mode: str = memory_modes.PLAIN) -> Layout:
    """Resolve the ``"auto"`` options of TrainConfig ``c`` for ``machine``; ``backend`` is the resolved
    FP8/layer backend (None = plain transformers); ``mcfg``: the run's ModelConfig (default: the one
    ``c`` made when validated); ``loss_kernel``: the fused loss's chunk kernel whose memory is counted (the run
    plan's ``fused_loss_kernel``; None: fp8lab.plan.fused_loss.kernel_for's rule). Raises ValueError when the layout
    cannot fit. ``c`` is not changed: fp8lab.plan.runplan keeps both."""
    mcfg = mcfg or c.model_config
    loss_kernel = loss_kernel or loss_kernel_for(machine)
    reasons: dict[str, str] = {}
    gpu = machine.gpu
    param_dtype = c.param_dtype
    if param_dtype == AUTO:
        param_dtype = "bf16" if gpu else "fp32"
        if gpu:
            reasons["param_dtype"] = "bf16 parameters + fp32 masters: no per-step weight casts"
    seq = c.seq_len
    if seq == AUTO:
        seq = min(GPU_SEQ_LEN if gpu else CPU_SEQ_LEN, mcfg.max_seq_len)
    sharded = is_sharded(c.parallel, machine.world_size)
    ga_auto, keep_auto, mb_auto = c.grad_accum == AUTO, c.fsdp_keep_weights == AUTO, c.micro_batch_size == AUTO
    budget = _budget(machine)
    step_tokens = OFFLOAD_TOKENS_PER_GPU_STEP if memory_modes.get(memory_mode).offloaded else TOKENS_PER_GPU_STEP

    def accum_for(mb: int) -> int:
        if not ga_auto:
            return c.grad_accum
        if not gpu:
            return 1
        per_micro = mb * seq
        cap = MAX_GLOBAL_TOKENS_PER_STEP // (per_micro * machine.world_size)
        return max(1, min(step_tokens // per_micro, cap, MAX_GRAD_ACCUM))

    def keep_for(ga: int) -> bool:
        if not keep_auto:
            return bool(c.fsdp_keep_weights)
        return gpu and sharded and ga > 1  # CPUs keep today's plain FSDP2

    # activation checkpointing "auto" is on only where no micro-batch fits without it (--micro-batch-size auto
    # on a GPU; decided on the larger of the BF16 and FP8 estimates, as the micro-batch is, so both runs of a pair
    # recompute alike); an explicit micro-batch that does not fit is refused, as before
    ckpt_options = ((False, True) if c.activation_checkpointing == AUTO and gpu and mb_auto
                    else (c.activation_checkpointing is True,))
    ckpt = ckpt_options[0]

    def est(mb: int, keep: bool, both: bool = True) -> MemoryEstimate:
        return _estimate_for(mcfg, c, machine, backend, param_dtype, mb, seq, accum_for(mb), keep,
                             both_precisions=gpu and both, activation_checkpointing=ckpt, sharded=sharded,
                             loss_kernel=loss_kernel, memory_mode=memory_mode)

    if mb_auto and gpu:
        candidates = [2**i for i in range(int(math.log2(max(1, MICRO_BATCH_TOKENS // seq))), -1, -1)]
        chosen = None
        for ckpt in ckpt_options:
            for mb in candidates:
                keep = keep_for(accum_for(mb))
                e = est(mb, keep)
                if e.peak <= budget:
                    chosen = (mb, keep, e)
                    break
                if keep and keep_auto and est(mb, False).peak <= budget:  # fits only with per-micro-batch gathers
                    chosen = (mb, False, est(mb, False))
                    break
            if chosen:
                break
        if chosen is None:
            e = est(1, False)
            tried = " with activation checkpointing" if ckpt else ""
            raise ValueError(
                f"--micro-batch-size auto: {c.model} does not fit {machine.name} ({machine.memory_gib:.0f} GiB per "
                f"GPU) even at micro-batch 1 x {seq}{tried}: estimated peak {e.describe()}; "
                + remedies(e, budget, sharded=sharded, ckpt_tried=ckpt))
        mb, keep, e = chosen
        ga = accum_for(mb)
        reasons["micro_batch_size"] = (f"micro-batch {mb}: fits {e.peak:.0f} of {machine.memory_gib:.0f} GiB"
                                       + (f" (the cap is {MICRO_BATCH_TOKENS:,} tokens)"
                                          if mb * seq == MICRO_BATCH_TOKENS else ""))
    else:
        mb = CPU_MICRO_BATCH if mb_auto else c.micro_batch_size
        ga = accum_for(mb)
        keep = keep_for(ga)
        e = est(mb, keep, both=False)
        if e.peak > machine.memory_gib:
            raise ValueError(
                f"--micro-batch-size={mb} with --seq-len={seq}: estimated peak memory {e.describe()} exceeds the "
                f"{machine.memory_gib:.0f} GiB of {machine.name}; "
                + remedies(e, machine.memory_gib, sharded=sharded, ckpt_tried=ckpt, explicit_batch=True))
    if ga_auto and gpu:
        why = (", twice the usual: offload's host copies cost the same per step"
               if step_tokens > TOKENS_PER_GPU_STEP else "")
        reasons["grad_accum"] = f"accumulation {ga}: {ga * mb * seq:,} tokens/GPU/step (target {step_tokens:,}{why})"
    if keep_auto and keep:
        reasons["fsdp_keep_weights"] = "FSDP2 keeps weights gathered: one all-gather per step"
    if ckpt and c.activation_checkpointing == AUTO:
        reasons["activation_checkpointing"] = (f"activation checkpointing: {c.model} at {seq} tokens fits "
                                               f"{machine.name} only recomputing each block in backward")
    _check_host(c, machine, memory_mode, e)
    return Layout(param_dtype, seq, mb, ga, keep, e, machine, reasons, activation_checkpointing=ckpt, sharded=sharded,
                  memory_mode=memory_mode)

