#!/usr/bin/env bash
# H200 call 20 (session 4), two GPUs, FP8 only: is call 16's 96.2% two-GPU efficiency flattered by its
# one-GPU reference? That reference used fused weight-gradient accumulation (on by default for one
# process; two-GPU FSDP2 cannot use it), and at 1B it measured 1-2% slower than autograd accumulation
# on other machines. Same machine, same harness settings as call 16, llama-1b, 16 x 4, FP8 delayed:
#  1. one GPU, --fuse-wgrad-accumulation False;  2. two GPUs, FSDP2 with kept weights;  3. one GPU, fused (call 16's setting).
set -u
R=$OUT; mkdir -p $R/throughput-h200
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --models llama-1b --steps 12 --warmup 4 --variants te-fp8-delayed-p16"
N="one of three FP8 runs on the same two-GPU machine in H200 call 20, one after another"
CUDA_VISIBLE_DEVICES=0 timeout 60 $B --work /tmp/w1 --tag mb16-ga4-nofw-alone-c20 --note "$N" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --fuse-wgrad-accumulation False" --timeout 58 2>&1 | grep "^\[bench\]"
timeout 75 $B --work /tmp/w2 --tag mb16-ga4-keep-c20 --nproc 2 --parallel fsdp --note "$N" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --fsdp-keep-weights True" --timeout 73 2>&1 | grep "^\[bench\]"
CUDA_VISIBLE_DEVICES=0 timeout 60 $B --work /tmp/w3 --tag mb16-ga4-alone-c20 --note "$N" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4" --timeout 58 2>&1 | grep "^\[bench\]"
