"""Process-group set-up and model wrapping for the trainer: one process, torchrun DDP, or FSDP2.

Rendezvous is torchrun's (``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR`` in the
environment, ``init_method="env://"``); nothing here invents its own. Without those variables
the trainer is a plain single process. NCCL on GPUs, gloo on CPUs (what the CPU tests use).
"""
from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import nn

from fp8lab.plan.options import PARALLEL as PARALLEL_MODES  # the trainer's vocabulary

PARAM_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class DistEnv:
    """Who this process is in the job and which device it computes on."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    initialized_here: bool  # we created the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def resolve_device(choice: str) -> torch.device:
    """'auto' -> cuda when available else cpu; 'cuda' without a GPU is a clear error."""
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA GPU is visible to torch here; use --device cpu or auto")
    return torch.device(choice)


def setup(device_choice: str = "auto") -> DistEnv:
    """Join the torchrun job when launched by torchrun; otherwise a world of one."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_choice)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    created = False
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://",
                                device_id=device if device.type == "cuda" else None)
        created = True
    return DistEnv(rank, local_rank, world, device, created)


def teardown(env: DistEnv) -> None:
    """Destroy the process group this run created, after collecting garbage.

    Why the collection: FSDP2 modules and optimizer states form reference cycles that can keep
    collective work objects (and their tensors) alive past ``destroy_process_group``; freed only at
    interpreter shutdown, gloo's C++ side can then abort the process ("terminate called without an
    active exception", seen once in CI on a finished two-rank FSDP2 run)."""
    import gc

    import torch.distributed as dist

    if env.initialized_here and dist.is_initialized():
        gc.collect()
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    import torch.distributed as dist

    if env.distributed:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum over ranks in place (gloo has no AVG, so callers divide)."""
    import torch.distributed as dist

    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def broadcast_object(obj, env: DistEnv):
    """Rank 0's Python object on every rank (e.g. the checkpoint to resume from)."""
    import torch.distributed as dist

    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def block_list(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks: the ModuleList holding the most parameters (HF ``layers``/``h`` or a fused stack)."""
    best, best_n = None, -1
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            n = sum(p.numel() for p in mod.parameters())
            if n > best_n:
                best, best_n = mod, n
    if best is None:
        raise ValueError(f"{type(model).__name__} has no nn.ModuleList of decoder blocks to shard / checkpoint / "
                         "compile")
    return best


def wrap(model: nn.Module, env: DistEnv, mode: str, param_dtype: str = "fp32") -> nn.Module:
    """DDP, or FSDP2 ``fully_shard`` per decoder block then the root; unchanged in a world of one.

    ``param_dtype="bf16"`` under FSDP2: the shards stay fp32 (the optimizer steps them) and every
    ``fully_shard`` gets ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: bf16
    all-gathers and compute, gradients reduce-scattered in fp32. Under DDP the caller has already
    made the parameters bf16 (fp8lab.train.master_weights), so DDP is wrapped as it is."""
    if mode not in PARALLEL_MODES:
        raise ValueError(f"--parallel must be one of {', '.join(PARALLEL_MODES)}, got {mode!r}")
    if param_dtype not in PARAM_DTYPES:
        raise ValueError(f"--param-dtype={param_dtype!r} is invalid; allowed: {' | '.join(PARAM_DTYPES)}")
    if not env.distributed:
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(env.device.type, (env.world_size,))
    kw = {}
    if param_dtype == "bf16":
        from torch.distributed.fsdp import MixedPrecisionPolicy

        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in block_list(model):
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    return model


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DDP (FSDP2 shards in place, so it is the model itself)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def _fsdp_modules(model: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def keep_gathered_weights(model: nn.Module) -> bool:
    """FSDP2 under gradient accumulation: gather each block's weights once per optimizer step.

    By default FSDP2 all-gathers a block's weights for its forward and again for its backward, in
    every micro-batch. Here the weights stay gathered from the first micro-batch's forward until
    the last one's backward (``gradient_sync(..., keep_weights=True)`` reshards them there): one
    all-gather per block per step, for the memory of the unsharded bf16 weights (as under DDP).
    Returns False (nothing changed) for a model that is not FSDP2-sharded."""
    mods = _fsdp_modules(model) if hasattr(model, "set_reshard_after_forward") else []
    for m in mods:
        m.set_reshard_after_forward(False, recurse=False)
    return bool(mods)


def reshard(model: nn.Module) -> None:
    """Free every FSDP2 module's gathered weights (after an evaluation under keep_gathered_weights)."""
    for m in _fsdp_modules(model):
        m.reshard()


@contextmanager
def gradient_sync(model: nn.Module, enabled: bool, keep_weights: bool = False) -> Iterator[None]:
    """Skip the gradient all-reduce / reduce-scatter on accumulation micro-steps but the last.

    ``keep_weights`` (FSDP2, see :func:`keep_gathered_weights`): reshard only after the last one's backward."""
    if type(model).__name__ == "DistributedDataParallel" and not enabled:
        with model.no_sync():
            yield
        return
    setter = getattr(model, "set_requires_gradient_sync", None)  # FSDP2 modules
    if setter is not None:
        setter(enabled)
        if keep_weights:
            model.set_reshard_after_backward(enabled)
    with nullcontext():
        yield


def apply_activation_checkpointing(model, backend: str | None, fp8_context) -> int:
    """Recompute every decoder block in backward; returns how many blocks were wrapped.

    Transformer Engine recomputes with its own ``te.checkpoint`` (keeps FP8 scaling state right);
    other backends use ``torch.utils.checkpoint`` re-entering their FP8 region for the recompute.
    The block's ``forward`` is wrapped on the instance, so parameter names do not change.
    """
    import functools

    import torch.utils.checkpoint as tuc

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


def compile_blocks(model) -> None:
    """torch.compile each decoder block, each its own frame (torchao's Float8Linear and TE guard on the
    module): without head-room dynamo stops compiling after 8 blocks and runs the rest eagerly."""
    import torch._dynamo

    blocks = block_list(model)
    limit = max(getattr(torch._dynamo.config, "recompile_limit", 8), 2 * len(blocks) + 8)
    torch._dynamo.config.recompile_limit = limit
    torch._dynamo.config.accumulated_recompile_limit = max(
        getattr(torch._dynamo.config, "accumulated_recompile_limit", 256), 4 * limit)
    for block in blocks:
        block.compile()
