#!/usr/bin/env bash
# Study: fp8lab on P5's GPU (one H100 80 GB) with the plain commands, and beside its peers
# (benchmarks/studies/p5_h100.md).
#   Question: with the evaluation bounded and checkpointed first, does every model of the README's table that fits
#   one H100 complete `fp8lab train --model M --precision bf16|fp8` (nothing else set) with a final validation loss,
#   its measured peak within the estimate; what are the FP8/BF16 ratios there; and how does fp8lab compare with what
#   a user would run instead (transformers + torch.compile, BF16 and torchao float8 tensorwise / rowwise /
#   rowwise_with_gw_hp, benchmarks/peers.py), on the same GPU in one call?
#   Prediction: every run completes (Qwen2.5-3B at 8K included); fp8lab's FP8 >= 1.25x the fastest peer variant.
# Parts (on a warm machine, each packs its results as it goes):
#   P  the peers (4 variants, llama-1b's shape, 8 x 2048 x 8) and fp8lab's plain llama-1b pair, same call (~8 min)
#   Q  Qwen2.5-3B from its published config at --seq-len 8192, both precisions (~5 min)
#   S  gptneo-125m and the llama-3b shape (long-context study's overrides) at their defaults, both precisions (~5 min)
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_p5.sh P
# Results: $OUT/results.tar.gz holds p5-h100/, peers-h100/ (for data/results/) and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/res
MODELS=/tmp/family-models
mkdir -p $RES/p5-h100 $RES/peers-h100 $RES/logs
H=(python3 benchmarks/throughput.py --out $RES/p5-h100 --study p5-h100 --work /tmp/bench --timeout 420 --steps 8 --warmup 3
   --variants default-bf16,default-fp8 --common-args '')
SHAPE_3B="--model-override hidden_size=3072,intermediate_size=8192,num_layers=28,num_heads=24,num_kv_heads=8,vocab_size=128256,tie_embeddings=True,rope_theta=500000.0"
pack() { cp /tmp/bench/*.log $RES/logs/ 2>/dev/null; tar -czf "$OUT/results.tar.gz" -C $RES . 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/gpu.txt
for part in "$@"; do
  t0=$(date +%s)
  case $part in
  P)  # (P2: the peers alone, after P on the same warm machine)
    python3 benchmarks/throughput.py --out $RES/peers-h100 --study peers-h100 --work /tmp/bench --timeout 300 --steps 8 \
      --warmup 3 --variants default-bf16,default-fp8 --common-args '' --tag h100 --models llama-1b; pack
    python3 benchmarks/peers.py --model llama-1b --out $RES/peers-h100 --study peers-h100 --suffix=-h100 2>&1 | tee $RES/logs/peers.log; pack
    ;;
  P2)
    python3 benchmarks/peers.py --model llama-1b --out $RES/peers-h100 --study peers-h100 --suffix=-h100 2>&1 | tee $RES/logs/peers.log; pack
    ;;
  Q)
    python3 benchmarks/family_folders.py --out $MODELS qwen2.5-3b | tee -a $RES/folders.txt
    "${H[@]}" --common-args '--seq-len 8192' --tag s8192-h100 --models $MODELS/qwen2.5-3b; pack
    ;;
  S)
    "${H[@]}" --tag h100 --models gptneo-125m; pack
    "${H[@]}" --common-args "$SHAPE_3B" --model-label llama-3b-shape --tag h100 --models llama-1b; pack
    ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "part $part: $(( $(date +%s) - t0 )) s"
done
pack
