"""Where a training step's GPU time goes, by kernel category (torch.profiler), BF16 vs FP8.

Builds the step from the same library pieces the trainer uses (build_model, convert_model,
fp8lab.autocast, the trainer's AdamW and clipping), profiles a few steady-state steps and prints
the share of GPU time in: FP8 GEMMs, BF16/other GEMMs, attention, casts/transposes/amax (FP8
bookkeeping), norms and activations, the optimizer, loss/softmax, and the rest. Diagnosis only:
throughput numbers come from ``throughput.py``.

    python benchmarks/profile_step.py --model llama-1b --variants te-bf16,te-fp8-delayed
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fp8lab.train.profiling import device_times, categorize  # noqa: E402  (the trainer's --profile-steps uses the same categories)


def profile(model_name: str, variant: str, mb: int, seq: int, steps: int, overrides: dict) -> dict:
    import torch
    import torch.nn.functional as F

    from fp8lab.fp8.convert import autocast, convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe
    from fp8lab.train.optim import make_optimizer
    from fp8lab.train.entry import TrainConfig

    precision, backend, recipe = {"hf-bf16": ("bf16", None, None), "te-bf16": ("bf16", "te", "delayed"),
                                  "te-fp8-delayed": ("fp8", "te", "delayed"), "te-fp8-current": ("fp8", "te", "current"),
                                  "te-fp8-block": ("fp8", "te", "block")}[variant]
    dev = torch.device("cuda")
    model = build_model(model_name, device=dev, seed=0, **overrides)
    rec = Recipe.parse(recipe) if recipe else None
    if backend:
        model = convert_model(model, backend=backend, recipe=rec, fuse=True)
    cfg = TrainConfig(model=model_name, precision=precision, backend=backend or "none")
    opt = make_optimizer(model, cfg, dev)
    vocab = model.config.vocab_size
    x = torch.randint(0, min(vocab, 21000), (mb, seq), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16), (autocast(backend, rec, enabled=precision == "fp8") if backend else torch.autocast("cuda", enabled=False)):
            logits = model(x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), x.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    with tprofile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels, _ = device_times(prof)  # kernels only (annotations such as Optimizer.step are not counted twice)
    totals: dict[str, float] = {}
    for name, t in kernels.items():
        cat = categorize(name)
        totals[cat] = totals.get(cat, 0.0) + t
    gpu_ms = sum(kernels.values()) / 1e3 / steps
    top = sorted(kernels.items(), key=lambda kv: -kv[1])[:15]
    return {"model": model_name, "variant": variant, "micro_batch_size": mb, "seq_len": seq,
            "gpu_ms_per_step": gpu_ms,
            "categories_ms": {k: v / 1e3 / steps for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms": [(k[:90], v / 1e3 / steps) for k, v in top]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-1b")
    p.add_argument("--variants", default="te-bf16,te-fp8-delayed")
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    results = [profile(args.model, v, args.micro_batch_size, args.seq_len, args.steps, {}) for v in args.variants.split(",")]
    for r in results:
        print(f"\n== {r['model']} {r['variant']}: {r['gpu_ms_per_step']:.1f} ms of kernels per step")
        for cat, ms in r["categories_ms"].items():
            print(f"  {cat:<40} {ms:8.1f} ms  {100 * ms / r['gpu_ms_per_step']:5.1f}%")
        for name, ms in r["top_kernels_ms"][:8]:
            print(f"    {ms:7.1f} ms  {name}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
