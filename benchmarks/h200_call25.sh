#!/usr/bin/env bash
# H200 call 25 (session 5): is torchao float8's 0.76x of TE BF16 on gptneo-1.3b (8 x 4) GPT-Neo's own
# eager attention (fp32 scores; no SDPA path in transformers), which torchao keeps and TE replaces?
# Prediction: in both compiled Hugging Face runs (BF16 and torchao FP8) most kernel time outside the
# linear layers is the attention's batched GEMMs and softmax, and FP8 shortens only the linear GEMMs.
# Profiles of steps 10-11 (--profile-steps), GPU 0 torchao FP8, GPU 1 BF16, side by side.
set -u
R=$OUT; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L | sed 's/ (UUID.*//'
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --models gptneo-1.3b --steps 12 --warmup 4 --timeout 230"
A="--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --param-dtype bf16 --profile-steps 10,11"
N="H200 call 25: steps 10-11 profiled (left out of the timing); the other GPU ran the other compiled gptneo-1.3b run"
(CUDA_VISIBLE_DEVICES=0 timeout 240 $B --work /tmp/w0 --tag ga4-prof --note "$N" --variants torchao-fp8-compile --common-args "$A") > $R/logs/gpu0.log 2>&1 &
(CUDA_VISIBLE_DEVICES=1 timeout 240 $B --work /tmp/w1 --tag ga4-prof --note "$N" --variants hf-bf16-compile-p16 --common-args "$A") > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]\|Error" $R/logs/gpu0.log $R/logs/gpu1.log | cut -c1-300
cd $R/throughput-h200 && python3 -c "
import glob, json
for f in sorted(glob.glob('*.profile.json')):
    p = json.load(open(f))['profile']
    print(f, 'busy %.3f' % p['gpu_busy'], 'step %.0f ms' % p['unprofiled_step_ms'], {k: round(v) for k, v in p['categories_ms'].items()})
    for name, ms in p['top_ms'][:8]: print('   %7.1f ms  %s' % (ms, name[:110]))
"
