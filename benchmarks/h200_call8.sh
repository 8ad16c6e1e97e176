#!/usr/bin/env bash
# H200 call 8, one GPU: the GPU tests again (after fixing call 7's two failures), then llama-7b at
# 16,384 tokens per optimizer step (micro-batch 1 x grad-accum 8, as in call 2) with the fused RoPE
# and FP8 weights cast once per step (TE's is_first_microbatch): fp32 parameters (FP8 current) and
# bf16 parameters with fp32 masters (--param-dtype bf16: BF16, FP8 current, FP8 delayed); the same
# tokens per step as micro-batch 2 x grad-accum 4; last, llama-1b plain transformers + torch.compile
# in the best BF16 layout of call 7 (bf16 parameters, grad-accum 4).
set -u
R=/tmp/res; mkdir -p $R
bash benchmarks/h200_gpu_tests.sh
timeout 230 python3 benchmarks/throughput.py --models llama-7b --tag ga8 \
  --variants te-bf16-p16,te-fp8-current-p16,te-fp8-delayed-p16,te-fp8-current \
  --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8" --out $R/throughput-h200 --timeout 70
timeout 110 python3 benchmarks/throughput.py --models llama-7b --tag mb2-ga4 \
  --variants te-bf16-p16,te-fp8-current-p16 \
  --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 4" --out $R/throughput-h200 --timeout 55
timeout 100 python3 benchmarks/throughput.py --models llama-1b --tag ga4 --variants hf-bf16-compile-p16 \
  --steps 14 --warmup 6 --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4" --out $R/throughput-h200 --timeout 98
