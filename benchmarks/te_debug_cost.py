"""Where a sample of ``--fp8-stats-source te-debug`` spends its time (issue 31). The GPU check
(data/results/fp8stats-sources/check.json) measured ~19 s per sampled step at llama-1b's default layout, against
0.29 s for fp8lab's hooks. This splits that cost by the statistics TE's debug API is asked for: one process per
variant (one debug session per process; each a child with its own timeout, its log written as it runs), llama-1b
widths with fewer blocks, the default micro-batch (16 x 2048) and 4 micro-batches a step, FP8 delayed scaling,
every second step sampled. ``*-first-mb`` variants stop feeding the statistics after the first micro-batch of a
sampled step (as fp8lab's hooks do). ``--profile`` adds a torch profiler over one sampled and one plain step to the
full variant: on the H200 that child ran past 240 s (session 18; without it, 38 s), so it is off by default.

    (device machine)  bash benchmarks/gpu.sh python3 benchmarks/te_debug_cost.py OUT_DIR [--layers 4] [--variants a,b]

Writes OUT_DIR/te-debug-cost.json (per variant: the step times, the mean sampled and plain step times, their
difference, the rows each sample recorded) and OUT_DIR/te-debug-cost-<variant>.log. Measured in session 18:
data/results/fp8stats-sources/te-debug-cost.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# name -> the features of the debug API's config (fp8lab.fp8.te_debug.config's shape); "full" is fp8lab's own
VARIANTS = {
    "full": None,
    "full-first-mb": None,  # fp8lab's statistics, the first micro-batch of a sampled step only (as the hooks do)
    "amax-only": {"LogTensorStats": ["cur_amax"]},
    "underflow-only": {"LogFp8TensorStats": ["underflows%"]},
    "scale-only": {"LogFp8TensorStats": ["scale_inv_min"]},
    "overflow-only": {"LogFp8TensorStats": ["overflows%"]},
    "no-overflow": {"LogFp8TensorStats": ["underflows%", "scale_inv_min"], "LogTensorStats": ["cur_amax"]},
    "fp8-pair": {"LogFp8TensorStats": ["underflows%", "scale_inv_min"]},
    "fp8-all": {"LogFp8TensorStats": ["underflows%", "scale_inv_min", "overflows%"]},
    "no-overflow-first-mb": {"LogFp8TensorStats": ["underflows%", "scale_inv_min"], "LogTensorStats": ["cur_amax"]},
}


def child(variant: str, layers: int, out: Path, profile_steps: bool = False) -> dict:
    import torch

    from fp8lab.fp8 import te_debug
    from fp8lab.fp8.backends import get_backend
    from fp8lab.fp8.convert import convert_model
    from fp8lab.model.models import build_model
    from fp8lab.fp8.recipe import Recipe

    import nvdlfw_inspect.api as debug_api

    every = 2
    first_mb = variant.endswith("first-mb")
    feats = VARIANTS[variant]
    if feats is not None:
        def config(every_, delayed):  # the same shape as te_debug.config, with only this variant's statistics
            tensors = list(te_debug.TENSORS)
            return {"fp8lab_health": {"enabled": True, "layers": {"layer_name_regex_pattern": ".*"},
                                      "transformer_engine": {f: {"enabled": True, "tensors": tensors, "freq": every_,
                                                                 "stats": s} for f, s in feats.items()}}}
        te_debug.config = config
    recipe = Recipe.parse("delayed")
    session = te_debug.start(every, recipe, out / f"te-debug-{variant}")
    model = convert_model(build_model("llama-1b", seed=0, device="cuda", dtype=torch.bfloat16, num_layers=layers),
                          backend="te", recipe=recipe)
    stats = te_debug.attach(model, session)
    ac = get_backend("te").autocast
    gen = torch.Generator(device="cuda").manual_seed(0)

    def step(i: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        sampled = stats.begin(i)
        for j in range(4):
            x = torch.randint(0, 32000, (16, 2048), device="cuda", generator=gen)
            with ac(recipe):
                loss = model(x).logits.float().logsumexp(-1).mean()
            loss.backward()
            if sampled and first_mb and j == 0:  # the buffers keep this step's iteration; later casts are not fed
                debug_api.initialize_training_step(te_debug.NEVER)
        rec = stats.end(i)
        if rec is not None:
            rows_seen.append(len(rec["layers"]))
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        print(f"step {i}: {dt:.3f} s{' (sampled)' if rec is not None else ''}", file=sys.stderr, flush=True)
        assert (rec is not None) == (i % every == 0), (i, rec)
        return dt

    rows_seen: list[int] = []
    times = {i: step(i) for i in range(1, 9)}  # steps 1-2 warm up
    sampled = [t for i, t in times.items() if i > 2 and i % every == 0]
    plain = [t for i, t in times.items() if i > 2 and i % every]
    res = {"variant": variant, "layers": layers, "steps": {str(k): round(v, 4) for k, v in times.items()},
           "sampled_s": statistics.mean(sampled), "plain_s": statistics.mean(plain),
           "sample_cost_s": statistics.mean(sampled) - statistics.mean(plain), "rows_per_sample": rows_seen}
    if variant == "full" and profile_steps:
        from torch.profiler import ProfilerActivity, profile

        lines = []
        for i in (10, 11):
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step(i)
            lines += [f"=== step {i} ({'sampled' if i % every == 0 else 'plain'})",
                      prof.key_averages().table(sort_by="cpu_time_total", row_limit=30),
                      prof.key_averages().table(sort_by="cuda_time_total", row_limit=15)]
        (out / "te-debug-profile.txt").write_text("\n".join(lines))
    session.close()
    return res


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--variant")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, in this order")
    p.add_argument("--profile", action="store_true", help="the full variant also profiles a sampled and a plain step")
    p.add_argument("--child-timeout-s", type=int, default=150)
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.variant:
        print(json.dumps(child(a.variant, a.layers, a.out, a.profile)))
        return
    results = []
    for v in a.variants.split(","):
        t0 = time.time()
        log = a.out / f"te-debug-cost-{v}.log"  # written as the child runs: a child cut off by its timeout leaves it
        with open(log, "w") as fh:
            try:
                r = subprocess.run([sys.executable, __file__, str(a.out), "--layers", str(a.layers), "--variant", v]
                                   + (["--profile"] if a.profile else []), stdout=subprocess.PIPE, stderr=fh,
                                   text=True, timeout=a.child_timeout_s)
                out, rc = r.stdout, r.returncode
            except subprocess.TimeoutExpired as e:
                out, rc = (e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""), "timeout"
        fh_text = log.read_text()
        got = (json.loads(out.strip().splitlines()[-1]) if rc == 0 else
               {"variant": v, "error": f"exit {rc}", "log_tail": fh_text[-1500:]})
        got["wall_s"] = round(time.time() - t0, 1)
        results.append(got)
        print(json.dumps({k: got.get(k) for k in ("variant", "sampled_s", "plain_s", "sample_cost_s", "wall_s", "error")}), flush=True)
        (a.out / "te-debug-cost.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
