#!/usr/bin/env bash
# Study: CUDA graphs for launch-bound steps (issue 19; benchmarks/studies/cuda_graphs.md).
#   Question: does replaying each decoder block's forward and backward as CUDA graphs make FP8 pay at
#   small micro-batches, where the step waits for TE's kernel launches?
#   Prediction: llama-7b 1 x 2048 x 8: FP8/BF16 1.05x eager -> >= 1.35x with both graphed (GPU busy
#   >= 90%); gptneo-1.3b 2 x 2048 x 16: 0.77-1.01x -> >= 1.15x; a large micro-batch (llama-1b 16 x 2048)
#   changes by < 2% either way; graphs hold little memory beyond eager (static inputs per block).
#   Part A: llama-7b mb1 and gptneo-1.3b mb2, BF16 and FP8, graphs on/off, profiled.
#   Part B (after part A ran out of memory graphing llama-7b with the FP8 weight cache held): llama-7b mb1
#   graphed (the FP8 weight cache off, as an early rule decided; it ran out of memory again, and
#   fits only since part C's streamed step), llama-1b 16 x 2048 x 4 FP8 graphs on/off,
#   gptneo-1.3b mb2 FP8 graphed and capped at 79.2 GiB (P5's H100).
#   Part C (session 8, after the streamed master-weight step and fused weight-gradient accumulation under
#   graphs): the graph tests first, then llama-7b 1 x 2048 x 8 graphed FP8 and BF16, then eager FP8 and
#   BF16 in the same call (a same-session pair), all profiled. Tag suffix -s8.
#   Part D (session 8): the other layouts on the new step, graphs on and off in one call: gptneo-1.3b
#   2 x 2048 x 16 BF16 and FP8 (profiled), llama-1b 16 x 2048 x 4 FP8, gptneo-1.3b FP8 graphed capped at
#   79.2 GiB (P5's H100).
#   Part E (session 8): the whole GPU test suite (no notebooks) on the final code, then the four llama-7b
#   1 x 2048 x 8 runs again with the peak memory *reserved* recorded (a graph's private pool stays
#   reserved while its tensors count as freed, so allocated memory understates a graphed run). Tag -s8-mem.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_cuda_graphs.sh A|B|C|D|E
# Results: $OUT/<part>-results.tar.gz holds data/results/graphs-h200/*.jsonl (+ .profile.json).
set -uo pipefail
PART=${1:?part A, B, C, D or E}
OUT=${OUT:-/tmp/out}
RES=/tmp/graphs-h200
H=(python3 benchmarks/throughput.py --study graphs-h200 --out $RES --work /tmp/bench --timeout 300)
V=te-bf16-p16,te-fp8-delayed-p16
pack() { tar -czf "$OUT/$PART-results.tar.gz" -C /tmp graphs-h200 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/$PART-gpu.txt"
case $PART in
A)
  for g in on off; do
    "${H[@]}" --models llama-7b --variants $V --tag mb1-ga8-graphs-$g \
      --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8 --cuda-graphs $g --profile-steps 9,10" \
      --steps 10 --warmup 3; pack
  done
  for g in on off; do
    "${H[@]}" --models gptneo-1.3b --variants $V --tag mb2-ga16-graphs-$g \
      --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --cuda-graphs $g --profile-steps 9,10" \
      --steps 10 --warmup 3; pack
  done
  ;;
B)
  "${H[@]}" --models llama-7b --variants $V --tag mb1-ga8-graphs-on \
    --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8 --cuda-graphs on --profile-steps 9,10" \
    --steps 10 --warmup 3; pack
  for g in on off; do
    "${H[@]}" --models llama-1b --variants te-fp8-delayed-p16 --tag mb16-ga4-graphs-$g \
      --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --cuda-graphs $g" --steps 10 --warmup 3; pack
  done
  "${H[@]}" --models gptneo-1.3b --variants te-fp8-delayed-p16 --tag mb2-ga16-graphs-on-p5mem \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --cuda-graphs on --gpu-memory-gib 79.2" \
    --steps 10 --warmup 3; pack
  ;;
C)
  FP8LAB_GPU_RESULTS=$OUT/gpu-results timeout 300 python3 -m pytest tests/gpu/test_graphs_gpu.py -q -rfEs --tb=short \
    -p no:cacheprovider > "$OUT/C-graphs-tests.log" 2>&1
  tail -3 "$OUT/C-graphs-tests.log"
  for g in on off; do
    "${H[@]}" --models llama-7b --variants te-fp8-delayed-p16,te-bf16-p16 --tag mb1-ga8-graphs-$g-s8 \
      --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8 --cuda-graphs $g --profile-steps 11,12" \
      --steps 14 --warmup 4; pack
  done
  ;;
D)
  for g in on off; do
    "${H[@]}" --models gptneo-1.3b --variants te-fp8-delayed-p16,te-bf16-p16 --tag mb2-ga16-graphs-$g-s8 \
      --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --cuda-graphs $g --profile-steps 9,10" \
      --steps 12 --warmup 3; pack
  done
  for g in on off; do
    "${H[@]}" --models llama-1b --variants te-fp8-delayed-p16 --tag mb16-ga4-graphs-$g-s8 \
      --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --cuda-graphs $g" --steps 12 --warmup 4; pack
  done
  "${H[@]}" --models gptneo-1.3b --variants te-fp8-delayed-p16 --tag mb2-ga16-graphs-on-p5mem-s8 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --cuda-graphs on --gpu-memory-gib 79.2" \
    --steps 12 --warmup 3; pack
  ;;
E)
  NOTEBOOKS=0 TEST_TIMEOUT=270 bash benchmarks/h200_gpu_tests.sh
  for g in on off; do
    "${H[@]}" --models llama-7b --variants te-fp8-delayed-p16,te-bf16-p16 --tag mb1-ga8-graphs-$g-s8-mem \
      --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8 --cuda-graphs $g" --steps 10 --warmup 3; pack
  done
  ;;
esac
