"""Forward+backward time and FP8 error of HF bf16 vs TE bf16 vs TE FP8 (swap and fused), on a GPU.

Run on an FP8 GPU with Transformer Engine installed, e.g.:

    python benchmarks/gpu_convert_check.py --models llama-1b gptneo-1.3b --batch-size 4 --seq-len 1024 \
        --out convert_speed.json

Prints one table per model and writes all rows (with GPU name and versions) as JSON. Timings are
medians of CUDA-event measurements (``fp8lab.fp8.convert.time_forward_backward``) and cover the model
alone: no optimizer, no data loading.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["llama-1b", "gptneo-1.3b"])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--num-layers", type=int, default=None, help="override depth (default: the published one)")
    p.add_argument("--recipe", default=None, help="delayed | current | block (default: TE's delayed)")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--out", default=None, help="JSON file for the rows")
    a = p.parse_args(argv)

    import torch
    import transformers

    from fp8lab.fp8.convert import available_backends, check_equivalence, compare_speed, convert_model
    from fp8lab.model.models import build_model

    reason = available_backends()["te"]
    if reason is not None:
        print(f"error: the te backend is not usable here: {reason}", file=sys.stderr)
        return 1
    import transformer_engine

    overrides = {"num_layers": a.num_layers} if a.num_layers else {}
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "transformers": transformers.__version__,
           "transformer_engine": transformer_engine.__version__, "batch_size": a.batch_size, "seq_len": a.seq_len,
           "recipe": a.recipe or "delayed", "models": {}}
    for name in a.models:
        rows = compare_speed(name, batch_size=a.batch_size, seq_len=a.seq_len, recipe=a.recipe,
                             warmup=a.warmup, iters=a.iters, **overrides)
        ref = build_model(name, device="cuda", dtype=torch.bfloat16, **overrides)
        ids = torch.randint(0, ref.config.vocab_size, (2, min(a.seq_len, 512)), device="cuda")
        conv = convert_model(copy.deepcopy(ref), backend="te", recipe=a.recipe, fuse=True)
        eq_bf16 = check_equivalence(ref, conv, ids)
        eq_fp8 = check_equivalence(ref, conv, ids, per_layer=True, fp8=True)
        del ref, conv
        torch.cuda.empty_cache()
        out["models"][name] = {"speed": rows, "bf16_equivalence": eq_bf16.as_dict(), "fp8_error": eq_fp8.as_dict()}
        print(f"\n{name} (batch {a.batch_size} x seq {a.seq_len}, {out['gpu']})")
        for r in rows:
            print(f"  {r['variant']:<18} {r['ms']:8.2f} ms  {r['tokens_per_s']:12.0f} tok/s  x{r['speedup_vs_hf_bf16']:.2f}")
        print(f"  fused TE bf16 vs HF: logits rel diff {eq_bf16.logits_rel_diff:.2e}, loss diff {eq_bf16.loss_abs_diff:.2e}")
        print(f"  fused TE FP8 vs HF:  logits rel diff {eq_fp8.logits_rel_diff:.2e}, loss diff {eq_fp8.loss_abs_diff:.2e}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
