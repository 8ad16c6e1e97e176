"""The optimizer of a run and its learning-rate schedule: AdamW, linear warm-up, then cosine decay."""
from __future__ import annotations

import math
from typing import Any, Callable


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
