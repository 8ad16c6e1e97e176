#!/usr/bin/env bash
# H200 call 8, one GPU: llama-7b, 16,384 tokens per optimizer step (micro-batch 1 x grad-accum 8,
# as in call 2), now with the fused RoPE and, in FP8, weights cast once per step (TE's
# is_first_microbatch); then bf16 parameters with fp32 masters (--param-dtype bf16), and the
# same at micro-batch 2 x grad-accum 4; then llama-1b plain transformers + torch.compile re-measured.
set -u
R=/tmp/res; mkdir -p $R
timeout 330 python3 benchmarks/throughput.py --models llama-7b --tag ga8 \
  --variants te-bf16,te-fp8-current,te-bf16-p16,te-fp8-current-p16,te-fp8-delayed-p16 \
  --steps 14 --warmup 5 --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8" --out $R/throughput-h200 --timeout 75
timeout 200 python3 benchmarks/throughput.py --models llama-7b --tag mb2-ga4 \
  --variants te-bf16-p16,te-fp8-current-p16 \
  --steps 14 --warmup 5 --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 4" --out $R/throughput-h200 --timeout 95
timeout 150 python3 benchmarks/throughput.py --models llama-1b --variants hf-bf16-compile \
  --steps 25 --warmup 12 --common-args "--seq-len 2048 --micro-batch-size 8" --out $R/throughput-h200 --timeout 145
