#!/usr/bin/env bash
# H200 call 12 (session 3, 2026-11-29), a two-GPU machine (nvidia-h200-x2).
#  GPU 0: llama-7b at micro-batch 2 (the largest that fits without activation checkpointing), now
#         with TE's weight-gradient GEMMs adding into the bf16 gradient buffer in place
#         (--fuse-wgrad-accumulation, on by default): 4 and 16 micro-batches per optimizer step, TE
#         BF16 and FP8 delayed / current; the last step of each run is profiled. Then one loss run.
#  GPU 1 (at the same time): the one-GPU tests (new code: fused wgrad accumulation), then the
#         llama-1b loss study (300 steps, 30-step warm-up; call 6 had 5): BF16, FP8 current, FP8
#         delayed with the first and last blocks in BF16; GPU 0 adds FP8 delayed.
#  Then both GPUs: the two-GPU trainer tests (DDP, FSDP2, incl. FSDP2 + TE BF16 with bf16 parameters).
set -u
R=/tmp/res; mkdir -p $R/throughput-h200 $R/loss-1b $R/logs
nvidia-smi -L
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
L="python3 benchmarks/loss_parity.py --data /tmp/data-32k --out $R/loss-1b --model llama-1b --study loss-1b --tag w30 \
   --steps 300 --val-every 50 --val-batches 4 --lr 3e-4 --common-args '--seq-len 2048 --micro-batch-size 8 --warmup-steps 30'"
NOTE="ran on GPU 0 of a two-GPU machine while GPU 1 ran the one-GPU tests and llama-1b loss runs (separate GPUs, 32 CPU cores)"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 190 $B --work /tmp/w0 --models llama-7b --tag mb2-ga16-fw --note "$NOTE" \
    --variants te-bf16-p16,te-fp8-delayed-p16,te-fp8-current-p16 --steps 8 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --profile-steps 8" --timeout 75
  timeout 150 $B --work /tmp/w0 --models llama-7b --tag mb2-ga4-fw --note "$NOTE" \
    --variants te-bf16-p16,te-fp8-delayed-p16 --steps 11 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 4 --profile-steps 11" --timeout 70
  unset PYTORCH_CUDA_ALLOC_CONF
  eval timeout 110 $L --work /tmp/l0 --timeout 105 --variants te-fp8-delayed --note "'ran on GPU 0 of a two-GPU machine'"
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 150 python3 -m pytest tests/test_train_gpu.py tests/test_convert_gpu.py -q -rfEs --tb=short -p no:cacheprovider \
    -k "not two_gpus" > $R/logs/gpu-tests-1gpu.log 2>&1
  eval timeout 300 $L --work /tmp/l1 --timeout 110 --variants te-bf16,te-fp8-current,te-fp8-delayed-edge1 \
    --note "'ran on GPU 1 of a two-GPU machine'"
) > $R/logs/gpu1.log 2>&1 &
wait
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/logs/gpu-tests-1gpu.log
grep -h "^\[bench\]\|^\[loss\]" $R/logs/gpu0.log $R/logs/gpu1.log
grep -h -A11 "fp8lab: profile" /tmp/w0/*.log 2>/dev/null | grep -v "^--- stderr\|fp8lab-metrics" | head -60
timeout 110 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "two_gpus" \
  > $R/logs/gpu-tests-2gpu.log 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/logs/gpu-tests-2gpu.log
for f in /tmp/w0/*.log /tmp/l0/*.log /tmp/l1/*.log; do grep -q "Traceback" $f && { echo "== $f"; grep -m2 -A1 "Error" $f | tail -4; }; done
