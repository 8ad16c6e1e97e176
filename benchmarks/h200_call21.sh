#!/usr/bin/env bash
# H200 call 21, prepared in session 4 (its device time was used up) and run in session 5.
# Needs a two-GPU machine (nvidia-h200-x2); what is still open in issue 7 after calls 16-20:
#  1. GPU 0: llama-7b plain transformers + torch.compile BF16 with bf16 parameters at 2 x 16 (is TE BF16
#     the best BF16 at 7B too?);  GPU 1 at the same time: gptneo-1.3b, the unfused TE module swap and
#     transformers + torch.compile BF16, both with bf16 parameters at 2 x 16 (8 x 4 ran out of memory).
#  2. Both GPUs free: llama-1b FP8 16 x 4, one after another on the same machine: one GPU without fused
#     weight-gradient accumulation, two GPUs (FSDP2, kept weights), one GPU with it (call 20 was cut off).
# Results go straight to $OUT so that a cut-off call still returns what finished.
set -u
R=$OUT; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 290 $B --work /tmp/w0 --models llama-7b --tag mb2-ga16 --note "ran on GPU 0 of a two-GPU machine while GPU 1 ran gptneo-1.3b runs" \
    --variants hf-bf16-compile-p16 --steps 8 --warmup 3 --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16" --timeout 285
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  N="ran on GPU 1 of a two-GPU machine while GPU 0 ran a llama-7b run"
  timeout 120 $B --work /tmp/w1 --models gptneo-1.3b --tag p16-mb2-ga16 --note "$N" --variants te-fp8-delayed-swap --steps 10 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --param-dtype bf16" --timeout 115
  timeout 165 $B --work /tmp/w1 --models gptneo-1.3b --tag mb2-ga16 --note "$N" --variants hf-bf16-compile-p16 --steps 10 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16" --timeout 160
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]" $R/logs/gpu0.log $R/logs/gpu1.log
B1="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --models llama-1b --steps 12 --warmup 4 --variants te-fp8-delayed-p16"
N1="one of three FP8 runs on the same two-GPU machine in H200 call 21, one after another"
CUDA_VISIBLE_DEVICES=0 timeout 80 $B1 --work /tmp/w2 --tag mb16-ga4-nofw-alone-c21 --note "$N1" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --fuse-wgrad-accumulation False" --timeout 78 2>&1 | grep "^\[bench\]"
timeout 80 $B1 --work /tmp/w3 --tag mb16-ga4-keep-c21 --nproc 2 --parallel fsdp --note "$N1" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --fsdp-keep-weights True" --timeout 78 2>&1 | grep "^\[bench\]"
CUDA_VISIBLE_DEVICES=0 timeout 70 $B1 --work /tmp/w4 --tag mb16-ga4-alone-c21 --note "$N1" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4" --timeout 68 2>&1 | grep "^\[bench\]"
