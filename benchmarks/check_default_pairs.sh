#!/usr/bin/env bash
# Check (issue #26, "plan once"): the plain commands keep their speed after the planning refactor.
#   `fp8lab train --model X --precision bf16|fp8` with nothing else set, llama-1b and llama-7b, one H200.
#   Expected (data/results/defaults-h200/, before the change): FP8/BF16 1.33x (llama-1b, 16 x 2048 x 4)
#   and 1.53x (llama-7b, 2 x 2048 x 32), each run's tokens/s within ~3% of the committed default run.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/check_default_pairs.sh
# Results: $OUT/results.tar.gz (defaults-plan-h200/*.jsonl: command, versions, GPU on each run line),
# $OUT/pairs.txt (the two ratios against the committed ones). About 6 minutes of GPU time.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/defaults-plan-h200
H=(python3 benchmarks/throughput.py --study defaults-plan-h200 --out $RES --work /tmp/bench --timeout 300)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
"${H[@]}" --models llama-1b --variants default-bf16,default-fp8 --tag plan --common-args '' --steps 14 --warmup 4
"${H[@]}" --models llama-7b --variants default-bf16,default-fp8 --tag plan --common-args '' --steps 8 --warmup 3
tar -czf "$OUT/results.tar.gz" -C /tmp defaults-plan-h200 2>/dev/null
python3 - "$RES" data/results/defaults-h200 <<'PY' | tee "$OUT/pairs.txt"
import json, sys
from pathlib import Path

def rate(folder, model, prec, tag=""):
    f = Path(folder) / f"{model}-default-{prec}{tag}.jsonl"
    if not f.is_file():
        return None, None
    lines = [json.loads(x) for x in f.read_text().splitlines() if x.strip()]
    run, summ = lines[0], [x for x in lines if x.get("record") == "summary"]
    return (summ[-1]["tokens_per_sec_per_gpu"] if summ else None), run

new, old = sys.argv[1], sys.argv[2]
for model in ("llama-1b", "llama-7b"):
    (nb, rb), (nf, rf) = rate(new, model, "bf16", "-plan"), rate(new, model, "fp8", "-plan")
    (ob, _), (of, _) = rate(old, model, "bf16"), rate(old, model, "fp8")
    if not (nb and nf):
        print(f"{model}: a run failed (see the logs)"); continue
    lay = f"{rb['micro_batch_size']} x {rb['seq_len']} x {rb['grad_accum']}"
    print(f"{model} {lay}: bf16 {nb:,.0f} tok/s (committed {ob:,.0f}), fp8 {nf:,.0f} (committed {of:,.0f}); "
          f"FP8/BF16 {nf / nb:.2f}x (committed {of / ob:.2f}x)")
PY
