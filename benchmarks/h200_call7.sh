#!/usr/bin/env bash
# H200 call 7, one GPU: llama-1b throughput after this session's changes, all in one session so
# they compare. (1) micro-batch 8 x 2048, one micro-batch per step: TE BF16 / FP8 delayed with the
# fused RoPE (new default), bf16 parameters (--param-dtype bf16);
# (2) grad-accum 4 (65,536 tokens per optimizer step and GPU): the optimizer step and FP8 weight
# casts are paid once per 4 micro-batches (FP8 weights cached via TE's is_first_microbatch).
set -u
bash benchmarks/h200_gpu_tests.sh  # after the fixes to call 6's failures
R=/tmp/res; mkdir -p $R
C1="--seq-len 2048 --micro-batch-size 8"
timeout 170 python3 benchmarks/throughput.py --models llama-1b --variants te-bf16,te-fp8-delayed,te-bf16-p16,te-fp8-delayed-p16 \
  --steps 25 --warmup 10 --common-args "$C1" --out $R/throughput-h200 --timeout 60
timeout 270 python3 benchmarks/throughput.py --models llama-1b --tag ga4 \
  --variants te-bf16,te-bf16-p16,te-fp8-delayed,te-fp8-delayed-p16,te-fp8-current-p16 \
  --steps 16 --warmup 6 --common-args "$C1 --grad-accum 4" --out $R/throughput-h200 --timeout 70
