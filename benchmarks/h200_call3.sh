#!/usr/bin/env bash
# Third H200 call (2026-11-29), on a two-GPU machine: torchrun + FSDP2 on 2 GPUs (llama-1b, BF16
# and FP8, 100 steps: per-GPU throughput against the 1-GPU runs, and the loss must fall), then
# torchao float8 under torch.compile again now that the trainer raises dynamo's recompile limit.
# Run from the repo root after installing the TE kit.
set -u
R=/tmp/res; mkdir -p $R
nvidia-smi -L
timeout 170 python3 benchmarks/throughput.py --models llama-1b --variants te-bf16,te-fp8-delayed --nproc 2 --parallel fsdp \
  --steps 100 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8 --val-every 50 --val-batches 4" \
  --out $R/throughput-h200 --timeout 85
timeout 120 python3 benchmarks/throughput.py --models llama-1b --variants torchao-fp8-compile,hf-bf16-compile \
  --steps 25 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8" --out $R/throughput-h200 --timeout 110
