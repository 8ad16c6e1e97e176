#!/usr/bin/env bash
# H200 call 13 (session 3, 2026-11-29), a two-GPU machine (nvidia-h200-x2).
#  GPU 0: llama-7b, micro-batch 2 x 16 per optimizer step (call 12's attempt timed out in the harness),
#         TE BF16 and FP8 delayed, fused weight-gradient accumulation; last step profiled.
#  GPU 1 (at the same time): llama-1b at micro-batch 8 x 8 with fused weight-gradient accumulation
#         (TE BF16, FP8 delayed), then one more loss remedy (amax history 16, most recent).
#  Then both GPUs: the two-GPU trainer tests (call 12 gave them 110 s, too little).
set -u
R=/tmp/res; mkdir -p $R/throughput-h200 $R/loss-1b $R/logs
nvidia-smi -L
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
L="python3 benchmarks/loss_parity.py --data /tmp/data-32k --out $R/loss-1b --model llama-1b --study loss-1b --tag w30 \
   --steps 300 --val-every 50 --val-batches 4 --lr 3e-4 --common-args '--seq-len 2048 --micro-batch-size 8 --warmup-steps 30'"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 230 $B --work /tmp/w0 --models llama-7b --tag mb2-ga16-fw --note "ran on GPU 0 of a two-GPU machine while GPU 1 ran llama-1b runs" \
    --variants te-bf16-p16,te-fp8-delayed-p16 --steps 8 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --profile-steps 8" --timeout 112
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 110 $B --work /tmp/w1 --models llama-1b --tag ga8-fw --note "ran on GPU 1 of a two-GPU machine while GPU 0 ran llama-7b runs" \
    --variants te-bf16-p16,te-fp8-delayed-p16 --steps 12 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 8" --timeout 54
  eval timeout 110 $L --work /tmp/l1 --timeout 105 --variants te-fp8-delayed-h16-recent --note "'ran on GPU 1 of a two-GPU machine'"
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]\|^\[loss\]\|FAILED" $R/logs/gpu0.log $R/logs/gpu1.log
grep -h -A11 "fp8lab: profile" /tmp/w0/*.log 2>/dev/null | grep -v "^--- stderr\|fp8lab-metrics" | head -30
timeout 250 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "two_gpus" \
  > $R/logs/gpu-tests-2gpu.log 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/logs/gpu-tests-2gpu.log
