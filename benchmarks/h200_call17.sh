#!/usr/bin/env bash
# H200 call 17 (session 4), a two-GPU machine, one-GPU work on each GPU at the same time:
#  GPU 0: llama-7b in the layout of the 1.51x (bf16 parameters, micro-batch 2 x 16): the variants
#         not yet measured at 7B: TE FP8 block scaling, the unfused module swap, torchao float8
#         under torch.compile.
#  GPU 1: the one-GPU GPU tests (trainer and conversion), then gptneo-1.3b (micro-batch 8 x 4):
#         plain transformers BF16, TE BF16 / FP8 delayed / current with bf16 parameters, and
#         block, swap and torchao with bf16 parameters (session 1 measured TE BF16 and FP8 only).
set -u
R=/tmp/res; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/te-h200/payload/torchao/*.whl 2>&1 | tail -1
python3 -c "import torchao; print('torchao', torchao.__version__)"
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 440 $B --work /tmp/w0 --models llama-7b --tag p16-mb2-ga16 \
    --note "ran on GPU 0 of a two-GPU machine while GPU 1 ran the GPU tests and gptneo-1.3b runs" \
    --variants te-fp8-block,te-fp8-delayed-swap,torchao-fp8-compile --steps 8 --warmup 3 \
    --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16 --param-dtype bf16" --timeout 145
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1
  timeout 130 python3 -m pytest tests/test_train_gpu.py tests/test_convert_gpu.py -q -rfEs --tb=short -p no:cacheprovider \
    -k "not two_gpus and not under_fsdp2" > $R/logs/gpu-tests-1gpu.log 2>&1
  N="ran on GPU 1 of a two-GPU machine while GPU 0 ran llama-7b runs"
  timeout 55 $B --work /tmp/w1 --models gptneo-1.3b --tag ga4 --note "$N" --variants hf-bf16 --steps 12 --warmup 4 \
    --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4" --timeout 53
  timeout 140 $B --work /tmp/w1 --models gptneo-1.3b --tag ga4 --note "$N" --variants te-bf16-p16,te-fp8-delayed-p16,te-fp8-current-p16 \
    --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4" --timeout 46
  timeout 200 $B --work /tmp/w1 --models gptneo-1.3b --tag p16-ga4 --note "$N" --variants te-fp8-block,te-fp8-delayed-swap,torchao-fp8-compile \
    --steps 12 --warmup 4 --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --param-dtype bf16" --timeout 100
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]" $R/logs/gpu0.log $R/logs/gpu1.log
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" $R/logs/gpu-tests-1gpu.log
for f in /tmp/w0/*.log /tmp/w1/*.log; do grep -q "Traceback\|Error" $f && { echo "== $(basename $f)"; grep -h "Error\|error" $f | tail -4 | cut -c1-400; }; done
cd $R && tar czf $OUT/call17.tgz throughput-h200 logs
