#!/usr/bin/env bash
# H200 call 6 (session 2, 2026-11-29), one GPU: the GPU tests after this session's changes (fused
# TE RoPE, FP8 weight cache across micro-batches, FSDP2 + TE BF16 guard), then llama-1b for 300
# steps in BF16 and FP8 (TE) with validation every 100 steps (issue 4: the loss must fall in both).
# Run from the repo root after installing the TE kit (see ../shared/te-h200/README.md).
set -u
R=/tmp/res; mkdir -p $R
nvidia-smi -L
# As run in call 6 the tests were an inline `pytest ... | tail -25` (same files); the shared script
# below replaced it for calls 7-9.
bash benchmarks/h200_gpu_tests.sh
timeout 320 python3 benchmarks/throughput.py --models llama-1b --variants te-bf16,te-fp8-delayed --study train-h200 \
  --steps 300 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8 --val-every 100 --val-batches 4" \
  --out $R/train-h200 --timeout 155
