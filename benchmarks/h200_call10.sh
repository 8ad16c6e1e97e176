#!/usr/bin/env bash
# H200 call 10 (last few device minutes), one GPU: llama-7b with bf16 parameters and fp32 masters at
# micro-batch 1 x grad-accum 8, now that one process gets fused AdamW even when the harness passes
# --parallel fsdp (calls 8-9 ran torch's foreach AdamW there, whose full-size temporaries ran out
# of memory); then the trainer's one-GPU tests once more on the changed optimizer choice.
set -u
R=/tmp/res; mkdir -p $R
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 150 python3 benchmarks/throughput.py --models llama-7b --tag ga8 --variants te-bf16-p16,te-fp8-current-p16 \
  --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8" --out $R/throughput-h200 --timeout 72
unset PYTORCH_CUDA_ALLOC_CONF
timeout 60 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "one_gpu or weight_cache" 2>&1 | tail -4
