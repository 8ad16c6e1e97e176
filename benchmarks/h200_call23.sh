#!/usr/bin/env bash
# H200 call 23 (session 5): call 22 found TE FP8 delayed slower than TE BF16 for gptneo-1.3b at 2 x 16
# (36,876 vs 40,582 tokens/s, FP8's IQR 33,856-43,940) while GPU 0 compiled a model beside it. Is that
# the small micro-batch (2 x 2,048 tokens: hidden size 2,048 gives small GEMMs, so casts and amax
# updates weigh more) or interference from the neighbour? The same three runs one after another on
# GPU 0 with nothing else on the machine, more steps: TE BF16, TE FP8 delayed fused, the unfused swap.
set -u
R=$OUT; mkdir -p $R/throughput-h200
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
timeout 300 python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --work /tmp/w5 \
  --models gptneo-1.3b --tag mb2-ga16-alone --steps 16 --warmup 4 --timeout 95 \
  --note "one after another on GPU 0 of a two-GPU machine, nothing else running (H200 call 23)" \
  --variants te-bf16-p16,te-fp8-delayed-p16,te-fp8-delayed-swap \
  --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --param-dtype bf16" 2>&1 | grep "^\[bench\]\|error" | cut -c1-300
