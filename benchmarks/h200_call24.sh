#!/usr/bin/env bash
# H200 call 24 (session 5): why does FP8 not pay off for gptneo-1.3b at 2 x 16 (call 23: BF16 46,777,
# FP8 delayed 43,702 tokens/s, both with steps ranging 37k-50k) while it gains 1.24x at 8 x 4?
# Prediction: at 2 x 2,048 tokens per micro-batch the step is bound by the host (kernel launches), the
# GPU idles between kernels, and FP8's extra kernels (casts, amax) add launch time without shortening
# any GEMM enough. Test: --profile-steps on two steps of each run (GPU busy = kernel time over step time),
# BF16 and FP8 at 2 x 16 and at 8 x 4, one after another on GPU 0, nothing else running.
set -u
R=$OUT; mkdir -p $R/throughput-h200
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --work /tmp/w6 --models gptneo-1.3b
  --steps 14 --warmup 4 --timeout 90 --variants te-bf16-p16,te-fp8-delayed-p16"
N="H200 call 24: steps 12-13 profiled (left out of the timing), one run after another on GPU 0, nothing else running"
timeout 200 $B --note "$N" --tag mb2-ga16-prof --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --profile-steps 12,13" 2>&1 | grep "^\[bench\]\|error" | cut -c1-300
timeout 200 $B --note "$N" --tag ga4-prof --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --profile-steps 12,13" 2>&1 | grep "^\[bench\]\|error" | cut -c1-300
cd $R/throughput-h200 && python3 -c "
import glob, json
for f in sorted(glob.glob('*.profile.json')):
    p = json.load(open(f))['profile']
    c = p['categories_ms']
    print(f, 'busy %.3f' % p['gpu_busy'], 'step %.0f ms' % p['unprofiled_step_ms'], {k: round(v) for k, v in c.items()})
"
