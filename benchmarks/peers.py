"""What a user would run instead of fp8lab: plain transformers + torch.compile, in BF16 and with torchao float8.

The peer is written the way the torchao and torchtitan examples train: a transformers ``LlamaForCausalLM`` (or the
family of the named shape) built from fp8lab's model shape, SDPA attention, fp32 parameters under bf16 autocast,
each decoder block ``torch.compile``d, ``torch.optim.AdamW(fused=True)``, gradient accumulation, and for FP8
torchao's ``convert_to_float8_training`` with one of its named recipes (the LM head stays in BF16, as torchao's
examples keep it). Nothing of fp8lab's trainer runs here: only the model's shape comes from fp8lab.

Each variant runs in its own process (a clean compile cache and a fresh peak-memory counter), trains
``--warmup + --steps`` optimizer steps on random tokens (throughput does not depend on the data), synchronises the
GPU after every step and writes one result file (``data/results/README.md``'s format) with the median tokens/s
of the timed steps. Run it in the same call as fp8lab's plain commands, so that both come from one GPU::

    bash benchmarks/gpu.sh python3 benchmarks/peers.py --model llama-1b --out /tmp/res/peers-h100

Variants: ``bf16`` (compile only), ``fp8-tensorwise``, ``fp8-rowwise``, ``fp8-rowwise_with_gw_hp``.
``--device cpu --no-compile`` runs the loop on a CPU (a smoke test of the script; no FP8 there).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = ("bf16", "fp8-tensorwise", "fp8-rowwise", "fp8-rowwise_with_gw_hp")


def _versions() -> dict:
    import torch
    import transformers

    out = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "cuda": torch.version.cuda}
    try:
        import torchao

        out["torchao"] = torchao.__version__
    except Exception:  # noqa: BLE001 - a BF16-only machine has no torchao
        out["torchao"] = None
    return out


def run_variant(a: argparse.Namespace) -> dict:
    """One variant in this process: the timed loop; returns the run record and summary."""
    import torch

    from fp8lab.model.models import build_model, model_flops_per_token
    from fp8lab.core.hardware import peak_bf16_flops

    dev = torch.device(a.device)
    torch.manual_seed(0)
    model = build_model(a.model, device=dev, dtype=torch.float32)  # a transformers model of fp8lab's shape
    model.config._attn_implementation = "sdpa"
    model.config.use_cache = False
    recipe = None
    if a.variant.startswith("fp8-"):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        recipe = a.variant.removeprefix("fp8-")
        config = Float8LinearConfig.from_recipe_name(recipe)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda m, fqn: (
            fqn != "lm_head" and m.in_features % 16 == 0 and m.out_features % 16 == 0))
    if a.compile:
        for block in model.model.layers:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=dev.type == "cuda")
    vocab = model.config.vocab_size
    g = torch.Generator(device=dev).manual_seed(1)
    times = []
    for step in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        for _ in range(a.grad_accum):
            x = torch.randint(0, vocab, (a.micro_batch_size, a.seq_len), device=dev, generator=g)
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                loss = model(input_ids=x, labels=x).loss
            (loss / a.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        if step >= a.warmup:
            times.append(time.perf_counter() - t0)
    tokens = a.micro_batch_size * a.seq_len * a.grad_accum
    tps = sorted(tokens / t for t in times)
    gpu = torch.cuda.get_device_name() if dev.type == "cuda" else platform.processor() or "cpu"
    peak = peak_bf16_flops(gpu) if dev.type == "cuda" else None
    med = statistics.median(tps)
    run = {"record": "run", "peer": True, "run_id": f"{a.model}-peer-{a.variant}{a.suffix}", "study": a.study, "model": a.model,
           "variant": f"peer-{a.variant}", "precision": "fp8" if recipe else "bf16", "backend": "torchao" if recipe else "compile",
           "recipe": recipe, "fuse": False, "compile": a.compile, "param_dtype": "fp32", "optimizer": "AdamW(fused)",
           "attention": "sdpa", "gpu_name": gpu, "world_size": 1, "instances": 1, "micro_batch_size": a.micro_batch_size,
           "grad_accum": a.grad_accum, "seq_len": a.seq_len, "versions": _versions(),
           "command": "python3 benchmarks/peers.py " + shlex.join(a.argv), "date": a.date,
           "note": "peer: plain transformers + torch.compile (+ torchao float8), benchmarks/peers.py; random tokens"}
    q = statistics.quantiles(tps, n=4) if len(tps) >= 2 else [med, med, med]
    summary = {"record": "summary", "tokens_per_sec_per_gpu": med, "tokens_per_sec_per_gpu_p25": q[0],
               "tokens_per_sec_per_gpu_p75": q[2], "tokens_per_sec_per_gpu_min": tps[0], "tokens_per_sec_per_gpu_max": tps[-1],
               "timed_steps": a.steps, "warmup_steps": a.warmup, "step_time_s": statistics.median(times),
               "mfu": med * model_flops_per_token(a.model_config, a.seq_len) / peak if peak else None,
               "mfu_peak_tflops": peak / 1e12 if peak else None, "tokens": tokens * (a.warmup + a.steps),
               "loss": float(loss.detach())}
    if dev.type == "cuda":
        summary["max_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30
        summary["max_reserved_gib"] = torch.cuda.max_memory_reserved() / 2**30
    return {"run": run, "summary": summary}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="llama-1b", help="an fp8lab named shape (fp8lab.model.models)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma list of: " + ", ".join(VARIANTS))
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=8, help="8 x 2048 x 8 = 131,072 tokens a step, as fp8lab's layout")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=3, help="optimizer steps left out (compilation, autotuning)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--study", default="peers-h100")
    p.add_argument("--suffix", default="", help="appended to each run id (e.g. -h100)")
    p.add_argument("--out", required=True, help="folder for the result files")
    p.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in a child process
    a = p.parse_args(argv)
    a.argv = argv
    for name in a.variants.split(","):
        if name not in VARIANTS:
            p.error(f"--variants: {name!r} is not one of {', '.join(VARIANTS)}")
    from fp8lab.model.models import get_config

    a.model_config = get_config(a.model)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    a.date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    if a.variant:  # the child: one variant, its result as JSON on the last line of stdout
        print(json.dumps(run_variant(a)), flush=True)
        return 0
    from fp8lab.analysis import write_result_file

    failed = 0
    for name in a.variants.split(","):
        child = [sys.executable, __file__, *argv, "--variant", name]
        t0 = time.time()
        proc = subprocess.run(child, capture_output=True, text=True, timeout=900)
        (out / f"{a.model}-peer-{name}{a.suffix}.log").write_text(proc.stdout[-20000:] + proc.stderr[-20000:])
        if proc.returncode != 0:
            failed += 1
            print(f"[peers] {name}: failed (exit {proc.returncode}); see its .log: {proc.stderr.strip().splitlines()[-1:]}",
                  flush=True)
            continue
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        got["run"].update(date=a.date, command="python3 benchmarks/peers.py " + shlex.join(argv))
        write_result_file(out / f"{got['run']['run_id']}.jsonl", run=got["run"], summary=got["summary"])
        s = got["summary"]
        print(f"[peers] {name}: {s['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, peak {s.get('max_mem_gib') or 0:.1f} GiB "
              f"({time.time() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
