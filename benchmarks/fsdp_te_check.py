"""FSDP2 + Transformer Engine with FP8 off: does backward run? (run under torchrun, any rank count)

    torchrun --standalone --nproc-per-node=1 benchmarks/fsdp_te_check.py --param-dtype fp32|bf16

One ``te.LayerNormMLP`` sharded with ``fully_shard``, forward and backward under bf16 autocast.
fp32 parameters (cast to bf16 inside TE) fail in TE 2.20.2; bf16 parameters (FSDP2's
``MixedPrecisionPolicy(param_dtype=bf16)``, what the trainer's ``--param-dtype bf16`` does) run.
Prints ``fsdp_te_check: ok`` on success; an exception exits non-zero with its message.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--param-dtype", choices=("fp32", "bf16"), required=True)
    args = ap.parse_args()
    import transformer_engine.pytorch as te
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    mlp = te.LayerNormMLP(256, 1024, normalization="RMSNorm", activation="swiglu", bias=False,
                          params_dtype=torch.float32, device="cuda")
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} \
        if args.param_dtype == "bf16" else {}
    fully_shard(mlp, mesh=mesh, **kw)
    x = torch.randn(4, 128, 256, device="cuda", requires_grad=True)
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16), te.autocast(enabled=False):
            y = mlp(x)
        y.float().square().mean().backward()
        assert all(p.grad is not None for p in mlp.parameters())
        print(f"fsdp_te_check: ok (param_dtype={args.param_dtype}, world={dist.get_world_size()})", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
