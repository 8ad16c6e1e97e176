#!/usr/bin/env bash
# Second H200 study call (2026-11-29): 7B and GPT-Neo-1.3B throughput, a kernel-time profile of
# llama-1b, and the loss-parity study. Run from the repo root after installing TE (te-h200 kit).
set -u
R=/tmp/res; mkdir -p $R
timeout 80 python3 benchmarks/profile_step.py --model llama-1b --variants te-bf16,te-fp8-delayed --out $R/profile-llama-1b.json 2>&1 | grep -v Warning
timeout 260 python3 benchmarks/throughput.py --models llama-7b --variants hf-bf16,te-bf16,te-fp8-delayed,te-fp8-current \
  --steps 16 --warmup 6 --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8" --out $R/throughput-h200 --timeout 140
timeout 100 python3 benchmarks/throughput.py --models gptneo-1.3b --variants hf-bf16,te-bf16,te-fp8-delayed \
  --steps 20 --warmup 8 --common-args "--seq-len 2048 --micro-batch-size 8" --out $R/throughput-h200 --timeout 60
timeout 125 python3 benchmarks/loss_parity.py --model gptneo-125m --variants te-bf16,te-fp8-delayed,te-fp8-current \
  --steps 240 --val-every 20 --common-args "--seq-len 512 --micro-batch-size 16" --out $R/loss-parity --timeout 50
