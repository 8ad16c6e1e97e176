"""CUDA graphs for launch-bound steps: each decoder block's forward and backward replayed as a graph.

Why: at a small micro-batch a step of Transformer Engine's fused layers is bound by the CPU, not
the GPU. Each block launches dozens of kernels through TE's Python front end (quantisation, amax
bookkeeping, GEMMs, attention, norms); when one block's kernels take less GPU time than the host
needs to launch them, the GPU waits (the llama-7b profile at micro-batch 1 showed it idle ~43% of
the step). A captured graph launches a block's whole forward, or its whole backward, in one call.

How: ``te.make_graphed_callables`` captures every decoder block (through a thin ``BlockCall`` that
holds the block's RoPE table, so the graph's only input is the hidden state) with the run's FP8
recipe, per-block FP8 on/off (``--bf16-edge-blocks``) and, under gradient accumulation, TE's FP8
weight cache (the graph re-casts the weights only when ``is_first_microbatch`` is True). The fused
model replays them while training (``FusedCausalLM.use_block_calls``); evaluation, a batch of
another shape and anything in eval mode run the eager blocks. Embedding, final norm, LM head and
the loss stay eager (a handful of large kernels).

What a graph needs, checked before anything is built (``problem``): a CUDA GPU, TE's fused layers,
bf16 parameters (the graph is captured outside ``torch.autocast``), one process (FSDP2's gathers and
DDP's hooks run outside the graph and are not supported here), no activation checkpointing and no
``torch.compile``. Fused weight-gradient accumulation stays on: the trainer's master weights run their
streamed step under graphs (``fp8lab.train.master_weights``), which zeroes the ``main_grad`` buffers in place
(the graphs' backward writes into them at fixed addresses) and steps the optimizer a chunk of fp32
gradients at a time, so the activations the graphs keep resident still leave room for the step.

``--cuda-graphs auto`` turns graphs on where the resolver predicts a launch-bound step
(``launch_bound``: little GPU work per block per micro-batch, by precision), the set-up supports
them and the layout still fits with what the graphs hold (``fp8lab.plan.layout.graphs_memory_problem``);
``on`` insists (a set-up that cannot be captured is refused up front, naming why); ``off`` never.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fp8lab.fp8.backends import get_backend
from fp8lab.model.models import block_matmul_params

CHOICES = ("auto", "on", "off")  # the --cuda-graphs vocabulary (fp8lab.plan.options takes it from here)

# Work per block per micro-batch (tokens x the block's parameters) below which the step is
# launch-bound on an H100/H200 with TE's fused layers. FP8's GEMMs take about half BF16's time, so
# FP8 becomes launch-bound at twice the work. Measured (data/results/throughput-h200/, graphs-h200/,
# profiles): FP8 llama-7b 1 x 2048 = 4.1e11 (GPU busy 59-67% eager, 96.5% graphed, 1.42x BF16 with
# both graphed), gptneo-1.3b 2 x 2048 = 2.0e11 (72%; graphed 1.23x BF16) against gptneo-1.3b 8 x 2048 =
# 8.2e11 (97.5%); BF16 llama-7b 1 x 2048 busy 97% eager and 1-2% slower graphed, gptneo-1.3b
# 2 x 2048 busy 85% eager and 14% faster graphed (which auto takes: 2.0e11 is below 3e11).
LAUNCH_BOUND_WORK = {"fp8": 6e11, "bf16": 3e11}


def work_per_block(mcfg, micro_batch_size: int, seq_len: int) -> float:
    """Tokens x GEMM weights of one decoder block per micro-batch: the GPU work one block's launches carry."""
    return micro_batch_size * seq_len * block_matmul_params(mcfg)


def launch_bound(mcfg, micro_batch_size: int, seq_len: int, precision: str = "fp8") -> bool:
    """True where one block's GPU work per micro-batch is too small to hide TE's launch overhead."""
    return work_per_block(mcfg, micro_batch_size, seq_len) < LAUNCH_BOUND_WORK[precision]


def problem(*, device_type: str, backend: str | None, fuse: bool, param_dtype: str, world_size: int,
            activation_checkpointing: bool, compile: bool, lora: bool = False) -> str | None:
    """Why this set-up cannot run its blocks as CUDA graphs (None: it can)."""
    if device_type != "cuda":
        return "CUDA graphs need a CUDA GPU"
    if backend != "te" or not fuse:
        return "CUDA graphs are implemented for Transformer Engine's fused layers (--backend te --fuse True)"
    if param_dtype != "bf16":
        return "CUDA graphs need --param-dtype bf16 (the blocks are captured outside torch.autocast)"
    if world_size > 1:
        return "CUDA graphs run in one process only (DDP's and FSDP2's hooks run outside the graph)"
    if activation_checkpointing:
        return "CUDA graphs cannot capture activation checkpointing (its recomputation runs in backward)"
    if compile:
        return "CUDA graphs and --compile do not combine here (choose one)"
    if lora:
        # the adapters' gradients are autograd's .grad, which a replay may leave pointing at the graph's own buffer,
        # so that the next micro-batch overwrites it (TE's main_grad path is the one tested under graphs)
        return "CUDA graphs are not tested with LoRA's adapters (--lora-rank)"
    return None


@dataclass(frozen=True)
class Decision:
    active: bool
    reason: str

    def describe(self) -> str:
        return f"CUDA graphs {'on' if self.active else 'off'}: {self.reason}"


def decide(choice: str, mcfg, *, micro_batch_size: int, seq_len: int, precision: str = "fp8",
           memory_problem: str | None = None, **setup: Any) -> Decision:
    """Resolve ``--cuda-graphs`` for a run; ``on`` with an unsupported set-up is a ValueError.

    ``memory_problem``: why the layout would not fit with its blocks captured (fp8lab.plan.layout), or None."""
    if choice not in CHOICES:
        raise ValueError(f"--cuda-graphs={choice!r} is invalid; allowed: {' | '.join(CHOICES)}")
    if choice == "off":
        return Decision(False, "--cuda-graphs off")
    why_not = problem(**setup) or memory_problem
    if choice == "on":
        if why_not:
            raise ValueError(f"--cuda-graphs on: {why_not}; use --cuda-graphs auto or off")
        return Decision(True, "--cuda-graphs on")
    work, limit = work_per_block(mcfg, micro_batch_size, seq_len), LAUNCH_BOUND_WORK[precision]
    if why_not:
        return Decision(False, f"auto: {why_not}")
    if work >= limit:  # not launch_bound()
        return Decision(False, f"auto: {work:.1e} token-params per block and micro-batch keep the GPU busy "
                               f"in {precision} (graphs pay below {limit:.0e})")
    return Decision(True, f"auto: {work:.1e} token-params per block and micro-batch: launch-bound in {precision} "
                          f"(below {limit:.0e})")


def _block_call_class():
    import torch

    class BlockCall(torch.nn.Module):
        """One fused block with its RoPE table bound, so the graph's only input is the hidden state."""

        def __init__(self, block, rope):
            super().__init__()
            self.block = block
            self.rope = rope  # a tensor, or None (GPT-Neo's learned positions live outside the blocks)

        def forward(self, x, is_first_microbatch=None):
            return self.block(x, self.rope, is_first_microbatch)

    return BlockCall


def _te_quantization_state():
    try:
        from transformer_engine.pytorch.quantization import FP8GlobalStateManager
    except ImportError:  # TE before 2.8
        from transformer_engine.pytorch.fp8 import FP8GlobalStateManager
    return FP8GlobalStateManager.quantization_state


@dataclass
class Captured:
    blocks: int
    weight_cache: bool
    capture_s: float
    # allocated after capture minus before: the tensors the graphs keep (FP8 weight cache, static buffers).
    # Not the graphs' private pool: its tensors count as freed once captured, yet stay reserved (the
    # steps' max_reserved_gib shows the whole footprint; reserved growth is no measure, as capture
    # empties torch's cache first)
    memory_gib: float

    def describe(self) -> str:
        return (f"{self.blocks} decoder blocks captured as CUDA graphs in {self.capture_s:.1f} s "
                f"({self.memory_gib:.2f} GiB allocated by the "
                f"graphs{', FP8 weight cache inside' if self.weight_cache else ''})")


def capture(model, *, micro_batch_size: int, seq_len: int, fp8: bool, recipe, weight_cache: bool,
            warmup_iters: int = 3) -> Captured:
    """Capture every decoder block of a fused TE model (on its GPU, in training mode) and make the
    model replay them while training. ``recipe``: the run's fp8lab ``Recipe`` (FP8 on) or None."""
    import torch
    import transformer_engine.pytorch as te

    dev = next(model.parameters()).device
    dtype = model.embed.weight.dtype
    rope = None if model.pos_embed is not None else model.rope_tables(seq_len, dev, dtype)
    BlockCall = _block_call_class()
    calls = tuple(BlockCall(b, rope).train() for b in model.blocks)
    te_recipe = get_backend("te").te_recipe(recipe) if fp8 else None
    cache = bool(weight_cache and fp8)
    if not cache:
        # TE keeps one process-wide "skip the FP8 weight update" flag, created by the first capture
        # with the weight cache and never cleared; a later capture without the cache would see it
        # and freeze its FP8 weights. (One graphed model at a time per process, as the trainer has.)
        _te_quantization_state().skip_fp8_weight_update_tensor = None
    torch.cuda.synchronize(dev)
    before = torch.cuda.memory_allocated(dev)
    t0 = time.perf_counter()
    # the capture's random sample inputs leave the run's RNG streams as they were (a resumed run
    # captures after restoring them, and must go on exactly as the uninterrupted run)
    with torch.random.fork_rng(devices=[dev]):
        sample = tuple((torch.randn(micro_batch_size, seq_len, model.spec.hidden, device=dev, dtype=dtype,
                                    requires_grad=True),) for _ in calls)
        graphed = te.make_graphed_callables(
            calls, sample, num_warmup_iters=warmup_iters,
            enabled=tuple(fp8 and b.fp8 for b in model.blocks), recipe=te_recipe,
            cache_quantized_params=cache)
    torch.cuda.synchronize(dev)
    captured = Captured(len(calls), cache, time.perf_counter() - t0,
                        (torch.cuda.memory_allocated(dev) - before) / 2**30)
    model.use_block_calls(graphed, (micro_batch_size, seq_len), pass_first_microbatch=captured.weight_cache)
    return captured
