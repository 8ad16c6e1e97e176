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
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_families.sh A|B|C|D|E
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
  folders mistral-7b-v0.3  # 12 steps, 3 untimed (session 10; 6 and 2 before: too few timed steps for its spread)
  "${H[@]}" --models $MODELS/mistral-7b-v0.3 --steps 12 --warmup 3; pack
  ;;
C)
  folders llama-3.1-8b:16
  "${H[@]}" --models $MODELS/llama-3.1-8b-16l --steps 6 --warmup 2; pack
  ;;
D)  # fallback for B if the full Mistral-7B runs out of memory (its estimate, 130 of 140 GiB, is close)
  folders mistral-7b-v0.3:16
  "${H[@]}" --models $MODELS/mistral-7b-v0.3-16l --steps 6 --warmup 2; pack
  ;;
E)  # calibration, not a speed claim: Mistral-7B-v0.3 FP8 with its blocks captured (--cuda-graphs on), the graphs'
    # memory margin (fp8lab.plan.layout.GRAPH_HOLD_FACTOR) set to 1.0 for this measurement only, so the plan admits it;
    # its peak reserved memory re-fits that margin. Then the same run eager (12 steps) for the noise of part B.
  folders mistral-7b-v0.3
  python3 -c "from fp8lab.data.tokens import prepare_data; prepare_data(None, '/tmp/bench/data-32k', None, vocab_size=32000)"
  for g in on off; do
    d=/tmp/bench/mistral-7b-v0.3-fp8-graphs-$g-s12
    python3 -c "import sys, fp8lab.plan.layout as L; L.GRAPH_HOLD_FACTOR = 1.0; from fp8lab.train.entry import main; sys.exit(main(sys.argv[1:]))" \
      --model $MODELS/mistral-7b-v0.3 --precision fp8 --cuda-graphs $g --steps 12 --warmup-steps 5 --output-dir $d \
      --checkpoint-every -1 --save-model False --plot False --progress off --val-every 0 --val-batches 1 --resume False \
      --seed 1234 --data /tmp/bench/data-32k > $OUT/E-graphs-$g.log 2>&1
    echo "graphs $g rc $?"; cp $d/metrics.jsonl $OUT/E-graphs-$g-metrics.jsonl 2>/dev/null; cp $d/config.json $OUT/E-graphs-$g-config.json 2>/dev/null
  done
  ;;
*) echo "part must be A, B, C, D or E" >&2; exit 2 ;;
esac
