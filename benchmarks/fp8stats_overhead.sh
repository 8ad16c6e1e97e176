#!/usr/bin/env bash
# FP8 health statistics: what they cost (issue 31). llama-1b in its default layout (16 x 2048 x 4 on an H200, FP8
# delayed scaling, bf16 parameters), 60 steps each with --fp8-stats-every 0, 10 and 25 (KS): the same data, seed and steps.
# ARMS instead of KS: "K:SOURCE ..." (SOURCE: --fp8-stats-source fp8lab | te-debug; "0" = off), e.g.
#   ARMS="0 10:fp8lab 10:te-debug" STUDY=fp8stats-sources CHECK=1 (TE's debug API beside fp8lab's hooks; CHECK=1 also
#   writes $RES/check.json, the check --fp8-stats-source auto reads: data/results/fp8stats-sources/check.json).
#   Goal: <= 2% of step time at the default K. Measured as the MEAN step time of steps 11-60 (a median would hide
#   the sampled steps' cost): benchmarks/fp8stats_overhead.py. Session 11's committed runs
#   (data/results/fp8stats-overhead/) were 0 and 10 at STEPS=40, then 25 at 60 steps in the next command.
#   Expected GPU time: 3 runs x (~40 s start-up + 60 x ~1.3 s) = ~6 min.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/fp8stats_overhead.sh
# CPU check of the script (no speed claim): MODEL=llama-tiny SMOKE=1 VARIANT=emulated-fp8-delayed STEPS=20 \
#   EXTRA="--seq-len 32 --micro-batch-size 2" OUT=/tmp/o bash benchmarks/fp8stats_overhead.sh
# Results: $OUT/$STUDY/*.jsonl (data/results format) and $OUT/$STUDY.json (the comparison).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
STUDY=${STUDY:-fp8stats-overhead}
RES=$OUT/$STUDY
STEPS=${STEPS:-60}
WORK=${WORK:-$OUT/.work-$STUDY}  # the runs' folders (one per study: two studies never share one)
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for arm in ${ARMS:-${KS:-0 10 25}}; do
  k=${arm%%:*}; src=$([ "$arm" = "$k" ] || echo "${arm#*:}")
  "$PY" benchmarks/throughput.py --models "${MODEL:-llama-1b}" --variants "${VARIANT:-default-fp8}" --steps "$STEPS" --warmup 10 \
    --common-args "--fp8-stats-every $k ${src:+--fp8-stats-source $src} ${EXTRA:-}" --tag "stats$k${src:+-$src}" \
    --study "$STUDY" --out "$RES" --work "$WORK" --timeout 300 ${SMOKE:+--cpu-smoke}
done
cp "$WORK"/*.log "$RES/" 2>/dev/null
"$PY" benchmarks/fp8stats_overhead.py "$RES" "$OUT/$STUDY.json" ${CHECK:+--check "$RES/check.json"}
