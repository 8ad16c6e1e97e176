#!/usr/bin/env bash
# Study: the models people bring, on the fused fast path (issue 27).
#   Question: with the plain commands `fp8lab train --model <folder> --precision bf16|fp8`, what FP8/BF16
#   ratio do the published shapes of Llama-3.2-1B, Qwen2.5-1.5B, Mistral-7B-v0.3 and Llama-3.1-8B get,
#   now that Llama 3.1+ RoPE scaling, Qwen2 and Mistral run fused?
#   Prediction (the targets): Llama-3.2-1B >= 1.27x (1.205x via --fuse False before),
#   Qwen2.5-1.5B >= 1.25x, Mistral-7B-v0.3 >= 1.45x.
#   Folders: data/reference/configs/<name>/config.json with random bf16 weights, save_pretrained here.
#   Fit on one H200 (fp8lab's layout resolver, estimated on the CPU): Llama-3.2-1B 16 x 2048 x 4 (118 GiB);
#   Qwen2.5-1.5B 8 x 2048 x 8 (91 GiB); Mistral-7B-v0.3 fits at 1 x 2048 x 32 (130 GiB); Llama-3.1-8B does
#   NOT fit (145 GiB at micro-batch 1: states 120, activations 11, FP8 weight cache 13), so part C runs its
#   first 16 layers (4.5B parameters, 4 x 2048 x 16, 105 GiB).
# Parts (expected GPU time on a warm machine, estimated from data/results/defaults-h200 step times plus
#   ~40 s start-up per run and the folder writes): A Llama-3.2-1B + Qwen2.5-1.5B ~4 min (4 runs of 8 steps);
#   B Mistral-7B-v0.3 ~4-5 min (2 runs of 6 steps, 14.5 GB folder written and loaded twice); C Llama-3.1-8B
#   at 16 layers ~3-4 min; D Mistral-7B-v0.3 at 16 layers (only if B runs out of memory) ~3 min.
#   A + B are the three targets (~8-9 min); C is the extra shape.
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_families.sh A|B|C|D
# Results: $OUT/<part>-results.tar.gz holds families-h200/*.jsonl (for data/results/families-h200/); logs beside.
set -uo pipefail
PART=${1:?part A, B, C or D}
OUT=${OUT:-/tmp/out}
RES=/tmp/families-h200
MODELS=/tmp/family-models
H=(python3 benchmarks/throughput.py --study families-h200 --out $RES --work /tmp/bench --timeout 420
   --variants default-bf16,default-fp8 --common-args '')
pack() { tar -czf "$OUT/$PART-results.tar.gz" -C /tmp families-h200 2>/dev/null; cp /tmp/bench/*.log "$OUT/" 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/$PART-gpu.txt"
folders() { python3 benchmarks/family_folders.py --out $MODELS "$@" | tee -a "$OUT/$PART-folders.txt"; }
case $PART in
A)
  folders llama-3.2-1b qwen2.5-1.5b
  "${H[@]}" --models $MODELS/llama-3.2-1b,$MODELS/qwen2.5-1.5b --steps 8 --warmup 3; pack
  ;;
B)
  folders mistral-7b-v0.3
  "${H[@]}" --models $MODELS/mistral-7b-v0.3 --steps 6 --warmup 2; pack
  ;;
C)
  folders llama-3.1-8b:16
  "${H[@]}" --models $MODELS/llama-3.1-8b-16l --steps 6 --warmup 2; pack
  ;;
D)  # fallback for B if the full Mistral-7B runs out of memory (its estimate, 130 of 140 GiB, is close)
  folders mistral-7b-v0.3:16
  "${H[@]}" --models $MODELS/mistral-7b-v0.3-16l --steps 6 --warmup 2; pack
  ;;
*) echo "part must be A, B, C or D" >&2; exit 2 ;;
esac
