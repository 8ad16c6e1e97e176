"""The LM head + cross-entropy alone on the GPU (issue 51): the plain path against fused/chunked versions.

For each vocabulary x hidden size (Llama-3.2-1B, Qwen2.5-1.5B, llama-1b) and tokens per micro-batch, one
forward + backward of ``loss(h @ W.T, y)`` in BF16 (bf16 hidden states and head, fp32 logits for the loss,
as the trainer runs it), timed with CUDA events (median of repeats after warm-up, fresh random inputs),
its peak memory above the inputs, and its exactness: loss, gradient of the hidden states and of the head
against an fp32 reference (the plain path on the same bf16 values upcast) and against the plain BF16 path.

Implementations: ``plain`` (``F.cross_entropy(logits.float())``, what the trainer does without
--fused-loss), ``fp8lab`` (fp8lab.train.fused_loss, chunk sizes given by --chunks), ``liger`` (liger-kernel's
fused linear cross-entropy, Triton) and ``cce`` (Apple's cut-cross-entropy, Triton; its default gradient
filter and with the filter off), where their wheels are installed.

    (device machine)  bash benchmarks/gpu.sh python3 benchmarks/fused_loss_bench.py --out $OUT/loss-bench.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

SHAPES = {"llama-3.2-1b": (128_256, 2048), "qwen2.5-1.5b": (151_936, 1536), "llama-1b": (32_000, 2048)}


def _impls(chunks: list[int]):
    import torch
    import torch.nn.functional as F

    from fp8lab.train.fused_loss import linear_cross_entropy

    out = {"plain": lambda h, w, y: F.cross_entropy((h @ w.t()).float(), y)}
    out["fp8lab"] = lambda h, w, y: linear_cross_entropy(h, w, y)  # its own chunk size (fp8lab.train.fused_loss.chunk_tokens)
    out["fp8lab-eager"] = lambda h, w, y: linear_cross_entropy(h, w, y, compiled=False)  # chunk math not compiled
    for c in chunks:
        out[f"fp8lab-chunk{c}"] = (lambda c: lambda h, w, y: linear_cross_entropy(h, w, y, chunk=c))(c)
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss

        liger = LigerFusedLinearCrossEntropyLoss()
        out["liger"] = lambda h, w, y: liger(w, h, y)
        try:
            liger32 = LigerFusedLinearCrossEntropyLoss(accum_dtype=torch.float32)
            out["liger-fp32-accum"] = lambda h, w, y: liger32(w, h, y)
        except TypeError:
            pass
    except Exception as exc:  # noqa: BLE001 - not installed / not importable: say so in the results
        print(f"liger-kernel: not available ({type(exc).__name__}: {exc})", flush=True)
    try:
        from cut_cross_entropy import linear_cross_entropy as cce

        out["cce"] = lambda h, w, y: cce(h, w, y)
        out["cce-no-filter"] = lambda h, w, y: cce(h, w, y, filter_eps=None)
    except Exception as exc:  # noqa: BLE001
        print(f"cut-cross-entropy: not available ({type(exc).__name__}: {exc})", flush=True)
    return out


def _versions() -> dict:
    import importlib.metadata as md

    import torch

    v = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
    for name in ("triton", "liger-kernel", "cut-cross-entropy"):
        try:
            v[name] = md.version(name)
        except md.PackageNotFoundError:
            v[name] = None
    return v


def _inputs(n: int, v: int, h: int, seed: int):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(n, h, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(v, h, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    y = torch.randint(0, v, (n,), device="cuda", generator=g)
    return x, w, y


def _one(fn, x, w, y, scale: float = 0.25):
    """One forward + backward of fn on fresh leaves; (loss, grad of x, grad of w)."""
    xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    loss = fn(xl, wl, y)
    (loss * scale).backward()
    return loss.detach().float(), xl.grad, wl.grad


def _rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def cuda_times(run, repeats: int, warmup: int, prepare=lambda i: ()) -> list[float]:
    """Milliseconds of ``run(*prepare(i))`` for each of ``repeats`` calls after ``warmup`` untimed ones: CUDA events
    around the call alone (``prepare(i)`` makes its arguments outside the timing). Also benchmarks/fused_loss_pieces.py."""
    import torch

    for i in range(warmup):
        run(*prepare(i))
    torch.cuda.synchronize()
    times = []
    for i in range(repeats):
        args = prepare(i)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run(*args)
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
        del args
    return times


def time_and_memory(fn, n, v, h, repeats: int, warmup: int) -> dict:
    import torch

    ins = [_inputs(n, v, h, 100 + i) for i in range(2)]  # two input sets, alternated (not one cached buffer)

    def prepare(i):
        x, w, y = ins[i % 2]
        return x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_(), y

    times = cuda_times(lambda x, w, y: (fn(x, w, y) * 0.25).backward(), repeats, warmup, prepare)
    x, w, y = ins[0]
    xl, wl = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    (fn(xl, wl, y) * 0.25).backward()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**30
    flops = 3 * 2 * n * v * h  # head forward, grad of h, grad of W
    ms = statistics.median(times)
    return {"ms_median": ms, "ms_min": min(times), "ms_max": max(times), "repeats": repeats,
            "tflops": flops / (ms / 1e3) / 1e12, "peak_gib_above_inputs": peak}


def exactness(impls: dict, n: int, v: int, h: int) -> dict:
    """Each implementation against the fp32 reference and against the plain BF16 path, same inputs."""
    import torch
    import torch.nn.functional as F

    x, w, y = _inputs(n, v, h, 7)
    ref = _one(lambda a, b, t: F.cross_entropy(a.float() @ b.float().t(), t), x.float(), w.float(), y)
    plain = _one(impls["plain"], x, w, y)
    out = {}
    for name, fn in impls.items():
        try:
            got = plain if name == "plain" else _one(fn, x, w, y)
        except Exception as exc:  # noqa: BLE001
            out[name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        row = {}
        for tag, base in (("fp32", ref), ("plain_bf16", plain)):
            row[f"loss_rel_vs_{tag}"] = abs(float(got[0]) - float(base[0])) / abs(float(base[0]))
            row[f"grad_hidden_rel_vs_{tag}"] = _rel(got[1], base[1])
            row[f"grad_head_rel_vs_{tag}"] = _rel(got[2], base[2])
        out[name] = row
        del got
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file written after every measurement")
    p.add_argument("--shapes", default=",".join(SHAPES))
    p.add_argument("--tokens", default="8192,32768", help="tokens per micro-batch, comma list")
    p.add_argument("--chunks", default="2048,8192", help="extra fp8lab chunk sizes to time")
    p.add_argument("--exact-tokens", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    import torch

    torch._dynamo.config.recompile_limit = 64  # one compiled chunk shape per vocabulary and chunk size

    impls = _impls([int(c) for c in a.chunks.split(",") if c])
    res = {"record": "loss-bench", "gpu_name": torch.cuda.get_device_name(), "versions": _versions(),
           "command": "python benchmarks/fused_loss_bench.py " + " ".join(x if x != a.out else "<out>" for x in (argv or sys.argv[1:])),
           "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "impls": list(impls),
           "timing": [], "exactness": {}}

    def save():
        Path(a.out).write_text(json.dumps(res, indent=1) + "\n")

    for shape in a.shapes.split(","):
        v, h = SHAPES[shape]
        t0 = time.time()
        res["exactness"][shape] = {"tokens": a.exact_tokens, "vocab": v, "hidden": h,
                                   "impls": exactness(impls, a.exact_tokens, v, h)}
        save()
        print(f"{shape}: exactness in {time.time() - t0:.0f} s", flush=True)
        for n in (int(t) for t in a.tokens.split(",")):
            for name, fn in impls.items():
                try:
                    row = time_and_memory(fn, n, v, h, a.repeats, a.warmup)
                except Exception as exc:  # noqa: BLE001 - e.g. out of memory: recorded, the others go on
                    row = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                torch.cuda.empty_cache()
                res["timing"].append({"shape": shape, "vocab": v, "hidden": h, "tokens": n, "impl": name, **row})
                save()
                print(f"{shape:13s} {n:6d} {name:20s} " + (f"{row['ms_median']:8.2f} ms {row['tflops']:6.0f} TFLOP/s "
                      f"{row['peak_gib_above_inputs']:6.2f} GiB" if "error" not in row else row["error"][:120]), flush=True)
    print("\nexactness (rel. to fp32 / to plain bf16): loss, grad hidden, grad head")
    for shape, e in res["exactness"].items():
        for name, r in e["impls"].items():
            if "error" in r:
                print(f"{shape:13s} {name:20s} {r['error'][:100]}")
                continue
            print(f"{shape:13s} {name:20s} " + " ".join(f"{r[k]:.1e}" for k in (
                "loss_rel_vs_fp32", "grad_hidden_rel_vs_fp32", "grad_head_rel_vs_fp32",
                "loss_rel_vs_plain_bf16", "grad_hidden_rel_vs_plain_bf16", "grad_head_rel_vs_plain_bf16")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
