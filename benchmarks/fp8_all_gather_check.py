"""FSDP2 with torchao's FP8 all-gather (issue 32): what dtype is gathered, how many bytes, and the same loss?

    torchrun --standalone --nproc-per-node=1 benchmarks/fp8_all_gather_check.py

llama-tiny converted by ``fp8lab.convert_model(..., backend="torchao", fp8_all_gather=True|False)``, each
decoder block and the root sharded with ``fully_shard`` (bf16 ``MixedPrecisionPolicy``, as the trainer's
``--param-dtype bf16``), one forward and backward of the same batch under bf16 autocast. Records the bytes
FSDP2 hands ``all_gather_into_tensor`` and the type of each Float8Linear's weight inside its forward.
Prints ``fp8_all_gather_check: {json}``: per mode the loss, the gathered bytes and dtypes, the weight types.
"""
from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist


def one(fp8_all_gather: bool, tokens: torch.Tensor) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torchao.float8.float8_linear import Float8Linear

    from fp8lab import distributed as fdist
    from fp8lab.convert import convert_model
    from fp8lab.models import build_model

    model = build_model("llama-tiny", device="cuda", seed=0)
    model = convert_model(model, backend="torchao", recipe="current", fp8_all_gather=fp8_all_gather)
    mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    for block in fdist.block_list(model):
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    gathered, weights = [], set()
    real = dist.all_gather_into_tensor

    def spy(out, inp, *a, **k):
        gathered.append((str(inp.dtype), inp.numel() * inp.element_size()))
        return real(out, inp, *a, **k)

    hooks = [m.register_forward_pre_hook(lambda m, _: weights.add(type(m.weight).__name__))
             for m in model.modules() if isinstance(m, Float8Linear)]
    dist.all_gather_into_tensor = spy
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
    finally:
        dist.all_gather_into_tensor = real
        for h in hooks:
            h.remove()
    return {"loss": float(loss), "gathered_bytes": sum(b for _, b in gathered),
            "gathered_dtypes": sorted({d for d, _ in gathered}), "weight_types": sorted(weights),
            "float8_linears": len(hooks)}


def main() -> None:
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl")
    try:
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 500, (4, 128), generator=g).cuda()
        out = {"bf16_all_gather": one(False, tokens), "fp8_all_gather": one(True, tokens),
               "world": dist.get_world_size(), "gpu": torch.cuda.get_device_name()}
        import torchao

        out["torch"], out["torchao"] = torch.__version__, torchao.__version__
        print("fp8_all_gather_check: " + json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
