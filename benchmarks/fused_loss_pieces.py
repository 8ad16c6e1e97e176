"""Where the chunked loss's time goes on the GPU (issue 51): each piece of one chunk timed alone.

fp8lab's fused loss (fp8lab.train.fused_loss) runs, per chunk of tokens, the head GEMM, one compiled kernel
for the log-sum-exp, loss and logits gradient, the GEMM for the hidden states' gradient and the GEMM for
the head's weight gradient summed in fp32. The whole function ran at 530-545 TFLOP/s in the loss benchmark
(data/results/fused-loss-h200/loss-bench.json) where its three GEMMs alone could run faster; this times
each piece, and the ways of summing the weight gradient in fp32, to find what is worth changing.

    (device machine)  bash benchmarks/gpu.sh python3 benchmarks/fused_loss_pieces.py --out $OUT/pieces.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

from fused_loss_bench import cuda_times  # (this folder: run as a script)

SHAPES = {"llama-3.2-1b": (128_256, 2048), "qwen2.5-1.5b": (151_936, 1536), "llama-1b": (32_000, 2048)}


def _timed(fn, repeats: int, warmup: int) -> float:
    return statistics.median(cuda_times(fn, repeats, warmup))


def pieces(v: int, h: int, n: int, repeats: int, warmup: int, quick: bool = False) -> dict:
    import torch

    from fp8lab.train import fused_loss as fl

    g0 = torch.Generator(device="cuda").manual_seed(0)
    hc = torch.randn(n, h, device="cuda", generator=g0).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g0) * 0.02).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=g0)
    valid = torch.ones(n, dtype=torch.bool, device="cuda")
    scale = torch.tensor(1.0 / n, device="cuda")
    from fp8lab.train import ce_kernel

    math = fl._math_for("cuda", "compiled")
    logits = hc @ w.t()
    _, g = math(logits, y, valid, scale)
    acc = torch.zeros(v, h, device="cuda", dtype=torch.float32)
    grad_h = torch.empty(n, h, device="cuda", dtype=torch.bfloat16)
    gemm = 2 * n * v * h
    out: dict = {}

    def rec(name, fn, flops=0):
        try:
            ms = _timed(fn, repeats, warmup)
        except Exception as exc:  # noqa: BLE001 - an op this build lacks: recorded, the others go on
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            print(f"  {name:34s} {out[name]['error'][:100]}", flush=True)
            return
        out[name] = {"ms": ms, **({"tflops": flops / (ms / 1e3) / 1e12} if flops else {})}
        print(f"  {name:34s} {ms:8.3f} ms" + (f" {out[name]['tflops']:6.0f} TFLOP/s" if flops else ""), flush=True)

    if not quick:
        rec("logits = hc @ w.t()", lambda: hc @ w.t(), gemm)
    rec("chunk math (compiled)", lambda: math(logits, y, valid, scale))
    buf = logits.clone()
    rec("chunk math (triton, in place)", lambda: ce_kernel.chunk_math(buf, y, valid, scale))
    del buf
    tuned = getattr(ce_kernel._autotuned(), "cache", {})  # triton.autotune: key -> the config it chose
    out["triton_configs_chosen"] = {str(k): str(c) for k, c in tuned.items()}
    print(f"  autotuned: {out['triton_configs_chosen']}", flush=True)
    # every config's time in the last tuning (triton.autotune's configs_timings: config -> ms), to see how close they are
    timings = getattr(ce_kernel._autotuned(), "configs_timings", None) or {}
    out["triton_configs_ms"] = {str(c): [round(float(x), 4) for x in (t if isinstance(t, (list, tuple)) else [t])]
                                for c, t in timings.items()}
    for c, t in out["triton_configs_ms"].items():
        print(f"    {c}: {t}", flush=True)
    if quick:
        return out
    rec("grad_h = g @ w", lambda: g @ w, gemm)
    rec("grad_h: mm(out=slice)", lambda: torch.mm(g, w, out=grad_h), gemm)
    rec("grad_w: g.t() @ hc (bf16 out)", lambda: g.t() @ hc, gemm)
    rec("grad_w^T: hc.t() @ g (bf16 out)", lambda: hc.t() @ g, gemm)
    rec("grad_w: mm(out_dtype=fp32)", lambda: torch.mm(g.t(), hc, out_dtype=torch.float32), gemm)
    rec("acc.add_(fp32 grad_w)", lambda: acc.add_(acc))
    rec("grad_w: mm fp32 + add_ (now)", lambda: acc.add_(torch.mm(g.t(), hc, out_dtype=torch.float32)), gemm)
    rec("grad_w: addmm(out_dtype=fp32, out=acc)",
        lambda: torch.addmm(acc, g.t(), hc, out_dtype=torch.float32, out=acc), gemm)
    rec("grad_w: acc.addmm_(g.t().float(), hc.float())", lambda: acc.addmm_(g.t().float(), hc.float()), gemm)
    rec("backward: grad_w.to(bf16).mul_(s)", lambda: acc.to(torch.bfloat16).mul_(0.25))
    # is addmm into acc exact? (same sum as mm fp32 + add)
    try:
        a1 = torch.zeros(v, h, device="cuda")
        a1.add_(torch.mm(g.t(), hc, out_dtype=torch.float32))
        a1.add_(torch.mm(g.t(), hc, out_dtype=torch.float32))
        a2 = torch.zeros(v, h, device="cuda")
        torch.addmm(a2, g.t(), hc, out_dtype=torch.float32, out=a2)
        torch.addmm(a2, g.t(), hc, out_dtype=torch.float32, out=a2)
        out["addmm_vs_mm_add_rel"] = float((a1 - a2).norm() / a1.norm())
        print(f"  addmm into acc vs mm + add: rel {out['addmm_vs_mm_add_rel']:.2e}", flush=True)
    except Exception as exc:  # noqa: BLE001
        out["addmm_vs_mm_add_rel"] = f"{type(exc).__name__}: {exc}"[:200]
    return out


def whole(v: int, h: int, n: int, chunks: list[int], repeats: int, warmup: int, kernel: str) -> dict:
    import torch

    from fp8lab.train.fused_loss import linear_cross_entropy

    g0 = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(n, h, device="cuda", generator=g0).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g0) * 0.02).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=g0)
    out = {}
    for c in [None, *chunks]:
        xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()

        def step():
            xl.grad = wl.grad = None
            (linear_cross_entropy(xl, wl, y, chunk=c, kernel=kernel) * 0.25).backward()

        ms = _timed(step, repeats, warmup)
        name = f"fused loss, {kernel}, chunk {c or 'default'}"
        out[name] = {"ms": ms, "tflops": 3 * 2 * n * v * h / (ms / 1e3) / 1e12}
        print(f"  {name:34s} {ms:8.3f} ms {out[name]['tflops']:6.0f} TFLOP/s", flush=True)
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--chunk-tokens", type=int, default=8192)
    p.add_argument("--tokens", type=int, default=32768, help="tokens of the whole function's timing")
    p.add_argument("--chunks", default="8192,16384", help="Triton kernel's chunk sizes timed beside its default")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="only the two chunk kernels and the whole function's default chunks")
    a = p.parse_args(argv)
    import torch

    import fp8lab.train.fused_loss  # noqa: F401

    torch._dynamo.config.recompile_limit = 64
    res = {"record": "loss-pieces", "gpu_name": torch.cuda.get_device_name(),
           "versions": {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]},
           "command": "python benchmarks/fused_loss_pieces.py " + " ".join(x if x != a.out else "<out>" for x in (argv or sys.argv[1:])),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "shapes": {}}
    for shape, (v, h) in SHAPES.items():
        print(f"{shape}: one chunk of {a.chunk_tokens} tokens", flush=True)
        res["shapes"][shape] = {"vocab": v, "hidden": h, "chunk_tokens": a.chunk_tokens,
                                "pieces": pieces(v, h, a.chunk_tokens, a.repeats, a.warmup, a.quick)}
        torch.cuda.empty_cache()
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
        print(f"{shape}: the whole function, {a.tokens} tokens", flush=True)
        res["shapes"][shape]["whole"] = {}
        for kernel, chunks in (("triton", "" if a.quick else a.chunks), ("compiled", "")):
            res["shapes"][shape]["whole"].update(whole(v, h, a.tokens, [int(c) for c in chunks.split(",") if c],
                                                       a.repeats, a.warmup, kernel))
        torch.cuda.empty_cache()
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
