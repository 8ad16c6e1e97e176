#!/usr/bin/env bash
# H200 call 16 (session 4), two GPUs: does two-GPU FSDP2 FP8 reach 95% of one GPU per GPU?
# Call 15 (micro-batch 8 x 4, --fsdp-keep-weights): FP8 91.5%, its step only 88% GPU-busy.
# Here: micro-batch 16 x 4 (twice the GPU work per launch) and, new, the FP8 weight cache under
# FSDP2 with kept weights (weights cast once per step); llama-1b, bf16 parameters, last step profiled.
#  1. two GPUs: FP8 delayed and BF16 at 16 x 4, --fsdp-keep-weights
#  2. one GPU, alone on the machine, the same layout and harness settings (the reference)
#  3. two GPUs: FP8 delayed at 8 x 4 with kept weights, now with the weight cache (call 15: 87,719)
set -u
R=/tmp/res; mkdir -p $R/throughput-h200
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --models llama-1b --steps 12 --warmup 4"
timeout 190 $B --work /tmp/w2 --tag mb16-ga4-keep --nproc 2 --parallel fsdp --variants te-fp8-delayed-p16,te-bf16-p16 \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --fsdp-keep-weights True --profile-steps 12" --timeout 92 2>&1 | grep "^\[bench\]"
CUDA_VISIBLE_DEVICES=0 timeout 170 $B --work /tmp/w1 --tag mb16-ga4-alone --variants te-fp8-delayed-p16,te-bf16-p16 \
  --note "one-GPU reference for call 16's two-GPU runs, alone on the machine" \
  --common-args "--seq-len 2048 --micro-batch-size 16 --grad-accum 4 --profile-steps 12" --timeout 82 2>&1 | grep "^\[bench\]"
timeout 75 $B --work /tmp/w3 --tag ga4-keep-cache --nproc 2 --parallel fsdp --variants te-fp8-delayed-p16 \
  --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --fsdp-keep-weights True --profile-steps 12" --timeout 72 2>&1 | grep "^\[bench\]"
for f in /tmp/w2/*.log /tmp/w1/*.log /tmp/w3/*.log; do echo "== $(basename $f)"; grep -h -A11 "fp8lab: profile" $f | grep -v "fp8lab-metrics\|^--- stderr"; done
python3 - <<'PY'
import glob, json
for p in sorted(glob.glob('/tmp/w*/*/config.json')):
    c = json.load(open(p)); print(p.split('/')[-2], 'cache', c.get('fp8_weight_cache_active'), 'keep', c.get('fsdp_keep_weights_active'), 'fused_wgrad', c.get('fuse_wgrad_accumulation_active'))
PY
cd $R && tar czf $OUT/call16.tgz throughput-h200
