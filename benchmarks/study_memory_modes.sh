#!/usr/bin/env bash
# Study: the memory modes on P5's GPU (one H100 80 GB; fp8lab.plan.memory_modes, benchmarks/studies/memory_modes.md).
#   Question: with TE's FusedAdam keeping 10 or 9 bytes per parameter instead of 16, do the 7-8B models train on one
#   H100 with `fp8lab train --model M --precision bf16|fp8`; what FP8/BF16 ratio and peak memory do they reach; and is
#   each mode's loss inside the plain mode's seed band (llama-1b, Linux corpus, 5M tokens, two seeds)?
# Parts (each packs its results as it goes):
#   T   the GPU tests of the modes (tests/gpu/test_memory_modes_gpu.py) (~1 min)
#   S7  llama-7b, both precisions, --memory bf16-moments (what auto picks there once its loss check holds) (~4 min)
#   L1  the loss runs of plain and bf16-moments, seeds 1234 and 4321 (~7 min)
#   L2  the loss runs of fp8-exp-avg, seeds 1234 and 4321 (~3.5 min)
#   L3  the loss runs of fp32-moments, seeds 1234 and 4321: TE's FusedAdam with fp32 moments, the control that tells
#       the moments' precision from the rest of the fused path (bf16 gradients, the library's step) (~3.5 min)
#   S8  Mistral-7B-v0.3 (bf16-moments) and Llama-3.1-8B (fp8-exp-avg) from their published configs, both precisions
#   L4  the loss runs of offload, seeds 1234 and 4321: plain's states and arithmetic with the masters and moments in
#       host memory (bit for bit the plain step by its tests; these runs are the loss check auto needs) (~7 min)
#   O7  llama-7b, both precisions, --memory offload: the layout the plain command plans once L4 holds; tag
#       h100-offload-262k since offload accumulates 262,144 tokens per step (h100-offload: 131,072) (~8 min)
#   O7P as O7 with --fp8-weights primary (the blocks' weights only in FP8; tag h100-offload-262k-fp8w); O7F: O7's FP8
#       run alone (~3 min each run; O7_STEPS=3 for a shorter O7P, O7_VARIANTS=default-fp8 for its FP8 run alone)
#   L5  the loss check of --fp8-weights primary: FP8 delayed under --memory offload, the blocks' weights only in FP8
#       against the cast ones, seeds 1234 and 4321 (L5_RUNS: a subset; ~3.5 min a run) into fp8-weights-h100/
#   O8  Mistral-7B-v0.3 and Llama-3.1-8B from their published configs (or O8_MODELS), both precisions, --memory
#       offload (~12 min)
#   OS  what one offloaded optimizer step of llama-7b costs beside the pinned copy rates (benchmarks/offload_step.py;
#       ~1 min; skipped when the call has less than 2 min left of its 10)
# Run on the device machine (carry .corpus/linux-6.1.tokens.tar.xz for L1/L2):
#   bash benchmarks/gpu.sh bash benchmarks/study_memory_modes.sh T S7
# Results: $OUT/results.tar.gz holds memory-modes-h100/ (for data/results/) and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/res
rm -rf $RES /tmp/bench  # a warm machine may keep an earlier call's results and logs: pack only this call's
mkdir -p $RES/memory-modes-h100 $RES/logs
H=(python3 benchmarks/throughput.py --out $RES/memory-modes-h100 --study memory-modes-h100 --work /tmp/bench
   --timeout 400 --steps 6 --warmup 2 --variants default-bf16,default-fp8)
pack() { cp /tmp/bench/*.log .study/memory-modes/*.log $RES/logs/ 2>/dev/null; tar -czf "$OUT/results.tar.gz" -C $RES . 2>/dev/null; }
loss() {
  if [ ! -f .corpus/linux-6.1/manifest.json ]; then tar -xJf .corpus/linux-6.1.tokens.tar.xz -C .corpus; fi
  python3 benchmarks/study_loss_parity.py --data .corpus/linux-6.1 --out $RES/memory-modes-h100 --work .study/memory-modes \
    --study memory-modes-h100 --tag-prefix 5m --tokens 5000000 --common-args '--seq-len 2048 --micro-batch-size 16 --grad-accum 1 --fp8-stats-every 0' \
    --gpus 1 --budget-s 470 --min-left-s 90 --runs "$1" 2>&1 | tee -a $RES/logs/loss.log
  python3 benchmarks/memory_modes_loss.py $RES/memory-modes-h100 > $RES/logs/loss-check.txt 2>&1
}
START=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/gpu.txt
for part in "$@"; do
  t0=$(date +%s)
  case $part in
  T)  python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_memory_modes_gpu.py > $RES/logs/tests.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $RES/logs/tests.txt; pack ;;
  S7) "${H[@]}" --common-args '--memory bf16-moments' --tag h100 --models llama-7b; pack ;;
  L1) loss mem-plain-s1234,mem-plain-s4321,mem-bf16-moments-s1234,mem-bf16-moments-s4321; pack ;;
  L2) loss mem-fp8-exp-avg-s1234,mem-fp8-exp-avg-s4321; pack ;;
  L3) loss mem-fp32-moments-s1234,mem-fp32-moments-s4321; pack ;;
  S8) "${H[@]}" --common-args '--memory bf16-moments' --tag h100 --models data/reference/configs/mistral-7b-v0.3; pack
      "${H[@]}" --common-args '--memory fp8-exp-avg' --tag h100 --models data/reference/configs/llama-3.1-8b; pack ;;
  L4) loss mem-offload-s1234,mem-offload-s4321; pack ;;
  L5) mkdir -p $RES/fp8-weights-h100
      if [ ! -f .corpus/linux-6.1/manifest.json ]; then tar -xJf .corpus/linux-6.1.tokens.tar.xz -C .corpus; fi
      python3 benchmarks/study_loss_parity.py --data .corpus/linux-6.1 --out $RES/fp8-weights-h100 --work .study/fp8w \
        --study fp8-weights-h100 --tag-prefix 5m --tokens 5000000 --common-args '--seq-len 2048 --micro-batch-size 16 --grad-accum 1 --fp8-stats-every 0' \
        --gpus 1 --budget-s 470 --min-left-s 90 --runs ${L5_RUNS:-fp8wcast-s1234,fp8wprimary-s1234,fp8wcast-s4321,fp8wprimary-s4321} 2>&1 | tee -a $RES/logs/loss.log
      python3 benchmarks/memory_modes_loss.py $RES/fp8-weights-h100 te-fp8-delayed-fp8w- cast > $RES/logs/fp8w-check.txt 2>&1
      pack ;;
  O7) "${H[@]}" --steps 5 --warmup 1 --common-args '--memory offload' --tag h100-offload-262k --models llama-7b; pack ;;
  O7P) "${H[@]}" --steps ${O7_STEPS:-5} --warmup 1 --common-args '--memory offload --fp8-weights primary' \
        --tag h100-offload-262k-fp8w --models llama-7b ${O7_VARIANTS:+--variants $O7_VARIANTS}; pack ;;
  O7F) "${H[@]}" --steps 5 --warmup 1 --common-args '--memory offload' --tag h100-offload-262k --models llama-7b \
        --variants default-fp8; pack ;;
  O8) for m in ${O8_MODELS:-mistral-7b-v0.3 llama-3.1-8b}; do
        "${H[@]}" --common-args '--memory offload' --tag h100-offload --models data/reference/configs/$m; pack
      done ;;
  OS) if [ $(( $(date +%s) - START )) -lt 480 ]; then
        python3 benchmarks/offload_step.py --model llama-7b --out $RES/logs/offload-step.jsonl > $RES/logs/offload-step.log 2>&1
        tail -4 $RES/logs/offload-step.log
      else echo "part OS skipped: the call's time is nearly spent"; fi; pack ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "part $part: $(( $(date +%s) - t0 )) s" | tee -a $RES/logs/parts.txt
done
pack
