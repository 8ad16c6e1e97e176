#!/usr/bin/env bash
# Study: the plain commands against the best hand-set layouts (issue "fast and valid on every path").
#   Question: with nothing set but --model and --precision, does `fp8lab train` (layout resolver,
#   TE fused layers for BF16 too) reach the best hand-set layout's throughput and FP8/BF16 ratio?
#   Prediction: llama-1b resolves to 16 x 2048 x 4 with bf16 parameters (the best hand-set layout):
#   FP8/BF16 >= 1.30, each default within 3% of the hand-set run; capped at 79.2 GiB (P5's H100)
#   the same layout fits; llama-7b resolves to 2 x 2048 x 32 (>= the 2 x 16 hand-set); the memory
#   estimate within 10% of each measured peak.
#   Part A: llama-1b defaults, hand-set, 80 GB cap. Part B: gptneo-1.3b and llama-7b. Part C: 7B hand-set.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_default_layouts.sh A|B|C
# Results: $OUT/<part>-*.tar.gz holds data/results/defaults-h200/*.jsonl; logs beside them.
set -uo pipefail
PART=${1:?part A, B or C}
OUT=${OUT:-/tmp/out}
RES=/tmp/defaults-h200
H=(python3 benchmarks/throughput.py --study defaults-h200 --out $RES --work /tmp/bench --timeout 300)
pack() { tar -czf "$OUT/$PART-results.tar.gz" -C /tmp defaults-h200 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/$PART-gpu.txt"
case $PART in
A)
  "${H[@]}" --models llama-1b --variants default-bf16,default-fp8 --common-args '' --steps 14 --warmup 4; pack
  "${H[@]}" --models llama-1b --variants te-bf16-p16,te-fp8-delayed-p16 --tag handset \
    --common-args '--seq-len 2048 --micro-batch-size 16 --grad-accum 4' --steps 14 --warmup 4; pack
  "${H[@]}" --models llama-1b --variants default-bf16,default-fp8 --tag p5mem --common-args '--gpu-memory-gib 79.2' \
    --steps 14 --warmup 4; pack
  ;;
B)
  "${H[@]}" --models gptneo-1.3b --variants default-bf16,default-fp8 --common-args '' --steps 12 --warmup 4; pack
  "${H[@]}" --models gptneo-1.3b --variants te-bf16-p16,te-fp8-delayed-p16 --tag handset \
    --common-args '--seq-len 2048 --micro-batch-size 8 --grad-accum 4' --steps 12 --warmup 4; pack
  "${H[@]}" --models llama-7b --variants default-bf16,default-fp8 --common-args '' --steps 8 --warmup 3; pack
  ;;
C)
  "${H[@]}" --models llama-7b --variants te-bf16-p16,te-fp8-delayed-p16 --tag handset \
    --common-args '--seq-len 2048 --micro-batch-size 2 --grad-accum 16' --steps 8 --warmup 3; pack
  ;;
esac
