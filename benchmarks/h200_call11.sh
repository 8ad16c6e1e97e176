#!/usr/bin/env bash
# H200 call 11 (session 3, 2026-11-29), a two-GPU machine (nvidia-h200-x2). Issue 7's open targets:
#  GPU 0: llama-7b. Call 10 gave FP8 only 1.05x at micro-batch 1 x 8. Hypothesis: at 2,048 tokens per
#         micro-batch the FP8 step is launch-bound (the GPU waits for Python between TE's small kernels).
#         Here: micro-batch 2 x 4 in BF16, FP8 current and FP8 delayed; micro-batch 4 x 2 with activation
#         checkpointing in BF16 and FP8 current; micro-batch 1 x 8 FP8 current again. Each run's last
#         step is recorded with torch.profiler (--profile-steps; left out of the timing): kernel time
#         by category and the GPU's busy fraction.
#  GPU 1 (at the same time, a separate GPU; noted in each run record): llama-1b at micro-batch 16 x 4
#         in TE BF16 and FP8 delayed (bf16 parameters), with a profile of the last step; plain
#         transformers + torch.compile (bf16 parameters) at micro-batch 8 x 8, the layout of the 1.31x.
#  Then both GPUs: torchrun + FSDP2, llama-1b, bf16 parameters (bf16 all-gathers), micro-batch 8 x 4,
#         TE BF16 and TE FP8 delayed (issue 7's two-GPU target: 95% of the one-GPU tokens/s/GPU).
# Run from the repo root after installing the TE kit (see ../shared/te-h200/README.md).
set -u
R=/tmp/res; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
NOTE="ran on GPU 0 of a two-GPU machine while GPU 1 ran llama-1b runs (separate GPUs, 32 CPU cores)"
NOTE1="ran on GPU 1 of a two-GPU machine while GPU 0 ran llama-7b runs (separate GPUs, 32 CPU cores)"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 200 $B --work /tmp/w0 --models llama-7b --tag mb2-ga4 --note "$NOTE" \
    --variants te-bf16-p16,te-fp8-current-p16,te-fp8-delayed-p16 --steps 11 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 4 --profile-steps 11" --timeout 66
  timeout 130 $B --work /tmp/w0 --models llama-7b --tag mb4-ga2-ac --note "$NOTE" \
    --variants te-bf16-p16,te-fp8-current-p16 --steps 11 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 4 --grad-accum 2 --activation-checkpointing True --profile-steps 11" --timeout 64
  timeout 60 $B --work /tmp/w0 --models llama-7b --tag ga8-prof --note "$NOTE" \
    --variants te-fp8-current-p16 --steps 9 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 1 --grad-accum 8 --profile-steps 9" --timeout 58
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1 TORCHINDUCTOR_COMPILE_THREADS=4
  timeout 120 $B --work /tmp/w1 --models llama-1b --tag mb16-ga4 --note "$NOTE1" \
    --variants te-bf16-p16,te-fp8-delayed-p16 --steps 12 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --profile-steps 12" --timeout 58
  timeout 200 $B --work /tmp/w1 --models llama-1b --tag ga8 --note "$NOTE1" \
    --variants hf-bf16-compile-p16 --steps 12 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 8" --timeout 195
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]" $R/logs/gpu0.log $R/logs/gpu1.log
grep -h -A12 "fp8lab: profile" /tmp/w0/*.log /tmp/w1/*.log 2>/dev/null | grep -v "^--- stderr" | head -80
timeout 150 $B --work /tmp/w2 --models llama-1b --tag ga4 --nproc 2 --parallel fsdp \
  --variants te-bf16-p16,te-fp8-delayed-p16 --steps 12 --warmup 4 \
  --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4" --timeout 72 2>&1 | grep -v Warning
for f in /tmp/w0/*.log /tmp/w1/*.log /tmp/w2/*.log; do grep -q "Error\|error" $f && { echo "== $f"; grep -m3 -B2 "Error" $f | tail -6; }; done
