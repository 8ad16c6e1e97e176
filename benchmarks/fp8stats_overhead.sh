#!/usr/bin/env bash
# FP8 health statistics: what they cost (issue 31). llama-1b in its default layout (16 x 2048 x 4 on an H200, FP8
# delayed scaling, bf16 parameters), 40 steps with --fp8-stats-every 0 and 40 with the default 10, the same tokens.
#   Goal: <= 2% of step time at the default K. Measured as the MEAN step time of steps 11-40 (3 of them sampled:
#   20, 30, 40): a median would hide the sampled steps' cost.
#   Expected GPU time: 2 runs x (~40 s start-up + 40 x ~1.3 s) = ~3 min.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/fp8stats_overhead.sh
# CPU check of the script (no speed claim): MODEL=llama-tiny SMOKE=1 VARIANT=emulated-fp8-delayed STEPS=20 \
#   EXTRA="--seq-len 32 --micro-batch-size 2" OUT=/tmp/o bash benchmarks/fp8stats_overhead.sh
# Results: $OUT/fp8stats-overhead/*.jsonl (data/results format) and $OUT/fp8stats-overhead.json (the comparison).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
RES=$OUT/fp8stats-overhead
STEPS=${STEPS:-40}
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for k in 0 10; do
  "$PY" benchmarks/throughput.py --models "${MODEL:-llama-1b}" --variants "${VARIANT:-default-fp8}" --steps "$STEPS" --warmup 10 \
    --common-args "--fp8-stats-every $k ${EXTRA:-}" --tag "stats$k" --study fp8stats-overhead --out "$RES" \
    --work /tmp/fp8stats-bench --timeout 300 ${SMOKE:+--cpu-smoke}
done
cp /tmp/fp8stats-bench/*.log "$RES/" 2>/dev/null
"$PY" - "$RES" "$OUT/fp8stats-overhead.json" <<'PY'
import json, statistics, sys
from pathlib import Path
res, out, work = Path(sys.argv[1]), Path(sys.argv[2]), Path("/tmp/fp8stats-bench")
mean = {}
for f in sorted(res.glob("*.jsonl")):
    lines = [json.loads(x) for x in f.read_text().splitlines()]
    k = "on" if f.stem.endswith("stats10") else "off"
    steps = [r["step_time_s"] for r in lines if r["record"] == "step" and r["step"] > 10 and r.get("step_time_s")]
    mean[k] = {"run": f.stem, "mean_step_time_s": statistics.mean(steps), "timed_steps": len(steps),
               "sampled_steps": sum('"fp8_stats"' in x for x in (work / f.stem / "metrics.jsonl").read_text().splitlines())}
result = {**mean, "overhead_pct": 100 * (mean["on"]["mean_step_time_s"] / mean["off"]["mean_step_time_s"] - 1)}
out.write_text(json.dumps(result, indent=2) + "\n")
print(json.dumps(result, indent=2))
PY
