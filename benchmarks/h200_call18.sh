#!/usr/bin/env bash
# H200 call 18 (session 4), a two-GPU machine.
#  1. Both GPUs: the two-GPU trainer tests, including the new FP8 weight cache under FSDP2 with kept weights.
#  2. One-GPU work on each GPU at the same time (call 17's leftovers):
#     GPU 0: llama-7b torchao float8 under torch.compile, bf16 parameters, 2 x 16 (call 17: compiling
#            had not finished within 145 s);
#     GPU 1: gptneo-1.3b plain transformers BF16 and the unfused TE module swap at micro-batch 2 x 16
#            (both ran out of memory at 8 x 4 in call 17: the eager GPT-Neo attention keeps fp32
#            score matrices), then torchao float8 + compile at 8 x 4 with more time.
set -u
R=/tmp/res; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/te-h200/payload/torchao/*.whl 2>&1 | tail -1
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
timeout 200 python3 -m pytest tests/test_train_gpu.py -q -rfEs --tb=short -p no:cacheprovider -k "two_gpus or under_fsdp2" \
  > $R/logs/gpu-tests-2gpu.log 2>&1
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/logs/gpu-tests-2gpu.log
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 320 $B --work /tmp/w0 --models llama-7b --tag p16-mb2-ga16 \
    --note "ran on GPU 0 of a two-GPU machine while GPU 1 ran gptneo-1.3b runs" \
    --variants torchao-fp8-compile --steps 8 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --param-dtype bf16" --timeout 315
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  N="ran on GPU 1 of a two-GPU machine while GPU 0 ran a llama-7b run"
  timeout 65 $B --work /tmp/w1 --models gptneo-1.3b --tag mb2-ga16 --note "$N" --variants hf-bf16 --steps 12 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16" --timeout 63
  timeout 65 $B --work /tmp/w1 --models gptneo-1.3b --tag p16-mb2-ga16 --note "$N" --variants te-fp8-delayed-swap \
    --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --param-dtype bf16" --timeout 63
  timeout 185 $B --work /tmp/w1 --models gptneo-1.3b --tag p16-ga4 --note "$N" --variants torchao-fp8-compile \
    --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --param-dtype bf16" --timeout 180
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]" $R/logs/gpu0.log $R/logs/gpu1.log
for f in /tmp/w0/*.log /tmp/w1/*.log; do echo "== $(basename $f)"; grep -v "^fp8lab-metrics\|^\s*$" $f | grep -iv "warn" | tail -4 | cut -c1-300; done
cd $R && tar czf $OUT/call18.tgz throughput-h200 logs
