#!/usr/bin/env bash
# H200 call 15 (session 3), two GPUs: FSDP2 with the weights gathered once per optimizer step
# (--fsdp-keep-weights) instead of twice per micro-batch; llama-1b, bf16 parameters, micro-batch 8 x 4,
# TE BF16 and FP8 delayed, last step profiled (compare call 14: 70,883 / 89,224 tokens/s/GPU);
# then the two-GPU trainer test of that option.
set -u
R=/tmp/res; mkdir -p $R/throughput-h200
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
timeout 150 python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --work /tmp/w2 \
  --models llama-1b --tag ga4-keep --nproc 2 --parallel fsdp --variants te-fp8-delayed-p16,te-bf16-p16 --steps 13 --warmup 4 \
  --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --fsdp-keep-weights True --profile-steps 13" --timeout 72 2>&1 | grep "^\[bench\]"
grep -h -A5 "fp8lab: profile" /tmp/w2/*.log | grep -v "fp8lab-metrics"
timeout 60 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "keep" 2>&1 | tail -3
