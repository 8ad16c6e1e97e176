#!/usr/bin/env bash
# Third H200 call (2026-11-29), on a two-GPU machine: torchrun + FSDP2 on 2 GPUs against 1 GPU
# (llama-1b, BF16 and FP8), a longer 1-GPU llama-1b run at micro-batch 16 in BF16 and FP8 (loss
# must fall; larger batch amortises per-step costs), and torchao float8 under torch.compile again
# now that the trainer raises dynamo's recompile limit. Run from the repo root after the TE kit.
set -u
R=/tmp/res; mkdir -p $R
nvidia-smi -L
timeout 150 python3 benchmarks/throughput.py --models llama-1b --variants te-bf16,te-fp8-delayed --nproc 2 --parallel fsdp \
  --steps 30 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8" --out $R/throughput-h200 --timeout 75
timeout 175 python3 benchmarks/throughput.py --models llama-1b --variants te-bf16,te-fp8-delayed --study train-h200 \
  --steps 120 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 16 --val-every 40 --val-batches 4" \
  --out $R/train-h200 --timeout 85
timeout 110 python3 benchmarks/throughput.py --models llama-1b --variants torchao-fp8-compile,hf-bf16-compile \
  --steps 25 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8" --out $R/throughput-h200 --timeout 100
