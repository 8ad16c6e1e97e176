"""Where the time of the chunked loss goes, with the LM head's GEMMs in BF16 and in FP8 (fp8lab.train.fp8_head).

Times, on one GPU, the chunked loss's forward and backward (fp8lab.train.fused_loss.linear_cross_entropy) at the
published heads' shapes and the plain commands' micro-batch (32,768 tokens), and each part of an FP8 chunk alone:
the three GEMMs (BF16 and FP8, with and without fast accumulation), the casts and transposes, and the weight
gradient's per-chunk fp32 sum. Prints one JSON line per measurement and writes them to --out. (The parts that go
through fp8lab.train.fp8_head time what it runs now: benchmarks/logs/session32/micro-h100.jsonl was measured when
its transposes were PyTorch's copies, the "g8 transpose copy" line.)

    python benchmarks/fp8_head_micro.py --out $OUT/micro.jsonl
"""
from __future__ import annotations

import argparse
import json

HEADS = {"llama-1b": (32000, 2048), "llama-3.2-1b": (128256, 2048), "qwen2.5-1.5b": (151936, 1536)}


def timed(fn, reps=10, warmup=3):
    """Median milliseconds of fn() over reps, by CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def _triton_transpose():
    """fp8lab.train.fp8_transpose's kernel at a given tile (rows x columns), or None without Triton on this GPU."""
    import torch

    from fp8lab.train import ce_kernel, fp8_transpose

    if not ce_kernel.available("cuda"):
        return None

    def run(x, bm, bn):
        M, N = x.shape
        y = torch.empty((N, M), device=x.device, dtype=x.dtype)
        fp8_transpose._kernel()[(-(-M // bm), -(-N // bn))](x.view(torch.uint8), y.view(torch.uint8), M, N,
                                                             BM=bm, BN=bn)
        return y

    return run


def main() -> None:
    import torch

    from fp8lab.plan.fused_loss import chunk_tokens, default_kernel
    from fp8lab.train import fp8_head, fused_loss

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=32768)
    args = ap.parse_args()
    out = open(args.out, "a")

    def emit(**row):
        print(json.dumps(row), flush=True)
        out.write(json.dumps(row) + "\n")
        out.flush()

    emit(gpu=torch.cuda.get_device_name(0), torch=torch.__version__)
    dev, bf = "cuda", torch.bfloat16
    kernel = default_kernel(True)
    n = args.tokens
    for name, (V, d) in HEADS.items():
        torch.manual_seed(0)
        h = (torch.randn(n, d, device=dev, dtype=bf) * 0.5).requires_grad_(True)
        w = (torch.randn(V, d, device=dev, dtype=bf) * 0.02).requires_grad_(True)
        t = torch.randint(0, V, (n,), device=dev)
        for fp8 in (False, True):
            c = chunk_tokens(V, n, kernel, fp8)

            def step():
                h.grad = w.grad = None
                fused_loss.linear_cross_entropy(h, w, t, kernel=kernel, fp8=fp8).backward()

            ms = timed(step)
            peak = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
            tflops = 6 * n * V * d / ms / 1e9
            emit(head=name, part="loss fwd+bwd", fp8=fp8, chunk=c, ms=round(ms, 3), gemm_tflops=round(tflops, 1),
                 peak_gib=round(peak, 2))
        # one chunk's parts, at the FP8 chunk size
        c = chunk_tokens(V, n, kernel, True)
        hc = h.detach()[:c].contiguous()
        wd = w.detach()
        g = torch.randn(c, V, device=dev, dtype=bf) * 1e-3
        gem = fp8_head.HeadGemms(wd, True)
        h8, h_inv = gem.input(hc)
        g8 = g.to(torch.float8_e5m2)
        one = torch.ones((), device=dev)
        acc = torch.zeros(V, d, device=dev, dtype=torch.float32)
        flops = 2 * c * V * d
        parts = {
            "bf16 logits h@W.T": lambda: hc @ wd.t(),
            "bf16 grad_h g@W": lambda: g @ wd,
            "bf16 grad_w addmm fp32": lambda: fused_loss._add_weight_grad(acc, g.t(), hc),
            "fp8 logits": lambda: gem.logits(h8, h_inv, bf),
            "fp8 grad_h": lambda: gem.grad_input(g8, one, bf),
            "fp8 grad_w (fp32 out, incl. transposes)": lambda: fp8_head.HeadGemms.grad_weight(g8, h8, one, h_inv,
                                                                                             torch.float32),
            "fp8 grad_w (bf16 out)": lambda: fp8_head.HeadGemms.grad_weight(g8, h8, one, h_inv, bf),
        }
        g8t = g8.t().contiguous()
        h8tt = h8.t().contiguous().t()
        parts["fp8 grad_w GEMM alone fp32"] = lambda: torch._scaled_mm(g8t, h8tt, scale_a=one, scale_b=h_inv,
                                                                       out_dtype=torch.float32)
        parts["fp8 grad_w GEMM alone bf16"] = lambda: torch._scaled_mm(g8t, h8tt, scale_a=one, scale_b=h_inv,
                                                                       out_dtype=bf)
        parts["fp8 logits fast_accum"] = lambda: torch._scaled_mm(h8, gem.w8.t(), scale_a=h_inv, scale_b=gem.w_inv,
                                                                  out_dtype=bf, use_fast_accum=True)
        parts["fp8 grad_h fast_accum"] = lambda: torch._scaled_mm(g8, gem.w8_t.t(), scale_a=one, scale_b=gem.w_inv,
                                                                  out_dtype=bf, use_fast_accum=True)
        parts["fp8 grad_w GEMM alone fp32 fast_accum"] = lambda: torch._scaled_mm(
            g8t, h8tt, scale_a=one, scale_b=h_inv, out_dtype=torch.float32, use_fast_accum=True)
        pw = torch.zeros(V, d, device=dev, dtype=torch.float32)
        parts["fp32 acc.add_(part)"] = lambda: acc.add_(pw)
        parts["g8 transpose copy"] = lambda: g8.t().contiguous()
        parts["g bf16->e5m2 cast"] = lambda: g.to(torch.float8_e5m2)
        parts["quantize h chunk"] = lambda: fp8_head.quantize(hc)
        parts["HeadGemms(W) per step"] = lambda: fp8_head.HeadGemms(wd, True)
        tr = _triton_transpose()
        if tr is not None:
            for bm, bn in ((64, 64), (128, 128), (64, 256)):
                parts[f"g8 transpose triton {bm}x{bn}"] = (lambda bm=bm, bn=bn: tr(g8, bm, bn))
            ok = torch.equal(tr(g8, 64, 64).view(torch.uint8), g8.t().contiguous().view(torch.uint8))
            emit(head=name, part="triton transpose equals torch's", ok=ok)
        for label, fn in parts.items():
            ms = timed(fn)
            gemm = "logits" in label or "grad_h" in label or "GEMM" in label or label.startswith("bf16")
            emit(head=name, part=label, chunk=c, ms=round(ms, 3),
                 tflops=round(flops / ms / 1e9, 1) if gemm else None)
        del g, g8, gem, acc, pw, h, w
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
