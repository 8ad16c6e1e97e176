"""The optimizer of a run and its learning-rate schedule: AdamW, linear warm-up, then cosine decay; with bf16
parameters, the master weights that keep their fp32 copies (and, under ``--fp8-weights primary``, write FP8 ones)."""
from __future__ import annotations

import math
from typing import Any, Callable

from fp8lab.fp8.fused import decoder_layers
from fp8lab.plan import memory_modes
from fp8lab.train import fp8_weights
from fp8lab.train.fused_states import FusedStates
from fp8lab.train.master_weights import MasterWeights


def lr_lambda(c, total_steps: int, warmup: int) -> Callable[[int], float]:
    """Multiplier of --lr after ``i`` optimizer steps: linear warm-up, then cosine down to --min-lr."""
    def f(i: int) -> float:
        if i < warmup:
            return (i + 1) / warmup
        progress = min(1.0, (i - warmup) / max(1, total_steps - warmup))
        return (c.min_lr + (c.lr - c.min_lr) * 0.5 * (1 + math.cos(math.pi * progress))) / c.lr
    return f


def make_optimizer(model, c, device, sharded: bool = False):
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


def master_weights(model, plan, c, device) -> tuple[Any, list, list]:
    """(the master weights, the parameters whose gradients TE adds into ``main_grad``, the blocks' FP8 weights) of a
    run with bf16 parameters: TE's FusedAdam in its memory modes, else fp8lab's fp32 masters (in host memory under
    ``--memory offload``; stepped a chunk at a time under CUDA graphs, where graphs write main_grad in place)."""
    mode = memory_modes.get(plan.memory_mode)
    if mode.fused_adam:  # fewer bytes per parameter: TE's FusedAdam keeps the states (fp8lab.plan.memory_modes)
        master = FusedStates(model, mode, c)
    else:
        master = MasterWeights(model, lambda ps: make_optimizer(ps, c, device), streamed=plan.streamed_step,
                               offload=device if mode.offloaded else None)
    fused_wgrad = []
    # DDP all-reduces .grad through hooks that main_grad would bypass: one process only (fp8lab.plan.runplan)
    if plan.fused_wgrad and hasattr(model, "wgrad_into_main_grad"):
        fused_wgrad = model.wgrad_into_main_grad()
        if fused_wgrad:
            master.use_main_grad(fused_wgrad)
    made = []
    if plan.fp8_primary_weights:  # from here on the blocks' weights exist only in FP8 (fp8lab.train.fp8_weights)
        weights = fp8_weights.block_weights([b for _, b in decoder_layers(model)])
        where = {id(getattr(m, n)): k for k, (m, n) in enumerate(weights)}
        # which of them the fused list holds, by position: it lets go of them, so each bf16 weight is freed as it
        # is replaced (at 7B, 12 GiB never held beside the FP8 ones)
        slots = [(where.get(id(p)), None if id(p) in where else p) for p in fused_wgrad]
        fused_wgrad = []
        made = fp8_weights.make_primary(weights, master, fp8_weights.te_quantizer(plan.recipe.to_te()))
        fused_wgrad = [p if k is None else made[k] for k, p in slots]
    return master, fused_wgrad, made
