"""FSDP2 with torchao's FP8 all-gather (issue 32): what dtype is gathered, how many bytes, and the same loss?

    torchrun --standalone --nproc-per-node=1 benchmarks/fp8_all_gather_check.py [--out FILE]          # GPU, NCCL
    torchrun --standalone --nproc-per-node=2 benchmarks/fp8_all_gather_check.py --device cpu          # CPU, gloo

llama-tiny converted to torchao's Float8Linear with and without the float8 all-gather (on the GPU through
``fp8lab.convert_model(..., backend="torchao", fp8_all_gather=...)``, as ``--fp8-all-gather`` wires it; on a CPU,
where that backend refuses to run, through the same conversion without its device check,
``fp8lab.fp8.backends.torchao.to_float8_training``), each decoder block and the root sharded with ``fully_shard``
(bf16 ``MixedPrecisionPolicy``, as the trainer's ``--param-dtype bf16``), one forward and backward of the same batch
under bf16 autocast. Records the dtype and bytes of each all-gather input FSDP2 builds: what the collective
sends (FSDP2's private ``_get_param_all_gather_inputs`` on several ranks; on one rank FSDP2 skips the collective
and copies each ``FSDPParam.all_gather_inputs`` instead, so the spy sits there), and the type of each
Float8Linear's weight inside its forward. Prints ``fp8_all_gather_check: {json}``: per mode the loss, the gathered
bytes and dtypes, the weight types, and ``problems``: the expectations the result fails (:func:`problems`; the
GPU and CPU tests assert it empty). ``--out`` also writes that JSON (rank 0).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist


def problems(res: dict) -> list[str]:
    """The check's expectations that ``res`` fails (empty: FP8 all-gather works as wired)."""
    bf16, fp8 = res["bf16_all_gather"], res["fp8_all_gather"]
    expect = {
        "both modes convert the same Float8Linear layers": bf16["float8_linears"] == fp8["float8_linears"] > 0,
        "the bf16 all-gather hands the layers plain weights": not any("Float8" in t for t in bf16["weight_types"]),
        "the FP8 all-gather hands the layers FP8 weights": any("Float8" in t for t in fp8["weight_types"]),
        "the FP8 all-gather gathers float8_e4m3fn": "torch.float8_e4m3fn" in fp8["gathered_dtypes"],
        # the linears' bytes halve; embeddings and norms stay bf16 (llama-tiny: 0.71 of the bf16 bytes)
        "the FP8 all-gather gathers under 0.75x the bf16 bytes": 0 < fp8["gathered_bytes"] < 0.75 * bf16["gathered_bytes"],
        # the same tensorwise casts, before or after the gather
        "the same loss within 2%": abs(fp8["loss"] - bf16["loss"]) <= 2e-2 * abs(bf16["loss"]),
    }
    return [what for what, ok in expect.items() if not ok]


def one(fp8_all_gather: bool, tokens: torch.Tensor, device: str) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives  # private: this check's spy only
    from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
    from torchao.float8.float8_linear import Float8Linear

    from fp8lab.train import distributed as fdist
    from fp8lab.fp8.backends.torchao import to_float8_training
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe

    model = build_model("llama-tiny", device=device, seed=0)
    if device == "cuda":
        model = convert_model(model, backend="torchao", recipe="current", fp8_all_gather=fp8_all_gather)
    else:
        to_float8_training(model, Recipe.parse("current"), None, fp8_all_gather)
    mesh = init_device_mesh(device, (dist.get_world_size(),))
    kw = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)}
    for block in fdist.block_list(model):
        fully_shard(block, mesh=mesh, **kw)
    fully_shard(model, mesh=mesh, **kw)
    gathered, weights = [], set()

    def record(inputs):
        gathered.extend((str(t.dtype), t.numel() * t.element_size()) for t in inputs)

    if dist.get_world_size() == 1:
        owner, name = FSDPParam, "all_gather_inputs"
        real = FSDPParam.all_gather_inputs

        def one_param(fsdp_param):
            inputs = real.fget(fsdp_param)
            record(inputs)
            return inputs
        spy = property(one_param)
    else:
        owner, name = _fsdp_collectives, "_get_param_all_gather_inputs"
        real = _fsdp_collectives._get_param_all_gather_inputs

        def spy(fsdp_params):
            per_param = real(fsdp_params)
            for inputs in per_param:
                record(inputs)
            return per_param

    hooks = [m.register_forward_pre_hook(lambda m, _: weights.add(type(m.weight).__name__))
             for m in model.modules() if isinstance(m, Float8Linear)]
    setattr(owner, name, spy)
    try:
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
    finally:
        setattr(owner, name, real)
        for h in hooks:
            h.remove()
    return {"loss": loss.item(), "gathered_bytes": sum(b for _, b in gathered),
            "gathered_dtypes": sorted({d for d, _ in gathered}), "weight_types": sorted(weights),
            "float8_linears": len(hooks)}


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda: NCCL; cpu: gloo (default cuda)")
    ap.add_argument("--out", help="also write the result JSON here (rank 0)")
    args = ap.parse_args(argv)
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    try:
        g = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 500, (4, 128), generator=g).to(args.device)
        out = {"bf16_all_gather": one(False, tokens, args.device), "fp8_all_gather": one(True, tokens, args.device),
               "world": dist.get_world_size(),
               "gpu": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"}
        import torchao

        out["torch"], out["torchao"] = torch.__version__, torchao.__version__
        out["problems"] = problems(out)
        if dist.get_rank() == 0:
            print("fp8_all_gather_check: " + json.dumps(out), flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    f.write(json.dumps(out, indent=1) + "\n")
        # every rank done before any tears down: under load a gloo rank that destroyed its group while the other was
        # still in its last collective aborted ("terminate called without an active exception", CI of session 20)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
