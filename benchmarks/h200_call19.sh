#!/usr/bin/env bash
# H200 call 19 (session 4), a two-GPU machine, the last of this session's device time:
#  1. the new two-GPU test (FP8 weight cache under FSDP2 with kept weights): call 18's 200 s ran out
#     after the five other two-GPU tests had passed;
#  2. gptneo-1.3b plain transformers BF16 at micro-batch 2 x 16 with more time (call 18: 63 s too few).
# Results go straight to $OUT so that a cut-off call still returns what finished.
set -u
R=$OUT; mkdir -p $R/throughput-h200
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
timeout 150 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "under_fsdp2" \
  > $R/gpu-tests-2gpu-cache.log 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/gpu-tests-2gpu-cache.log
CUDA_VISIBLE_DEVICES=0 timeout 140 python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --work /tmp/w9 \
  --models gptneo-1.3b --tag mb2-ga16 --note "alone on a two-GPU machine" --variants hf-bf16 --steps 10 --warmup 4 \
  --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16" --timeout 135 2>&1 | grep "^\[bench\]"
