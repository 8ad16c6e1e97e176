#!/usr/bin/env bash
# H200 call 22 (session 5), two GPUs side by side; gptneo-1.3b at one layout for every variant that call 21
# left without a partner: call 21 measured transformers + compile BF16 (36,037) and the unfused swap (18,626)
# only at 2 x 16, while TE BF16 and FP8 fused were measured only at 8 x 4.
#  GPU 0: transformers + torch.compile BF16 at 8 x 4 (plain transformers ran out of memory there; does compile fit?)
#  GPU 1: TE BF16 and TE FP8 delayed (fused) at 2 x 16, the layout of the swap and compile runs.
set -u
R=$OUT; mkdir -p $R/throughput-h200 $R/logs
nvidia-smi -L | sed 's/ (UUID.*//'
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
B="python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --models gptneo-1.3b --steps 10 --warmup 4"
(
  export CUDA_VISIBLE_DEVICES=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 200 $B --work /tmp/w0 --tag ga4 --note "ran on GPU 0 of a two-GPU machine while GPU 1 ran gptneo-1.3b TE runs" \
    --variants hf-bf16-compile-p16 --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4" --timeout 195
) > $R/logs/gpu0.log 2>&1 &
(
  export CUDA_VISIBLE_DEVICES=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  timeout 200 $B --work /tmp/w1 --tag mb2-ga16 --note "ran on GPU 1 of a two-GPU machine while GPU 0 ran a gptneo-1.3b compile run" \
    --variants te-bf16-p16,te-fp8-delayed-p16 --common-args "--seq-len 2048 --micro-batch-size 2 --grad-accum 16" --timeout 98
) > $R/logs/gpu1.log 2>&1 &
wait
grep -h "^\[bench\]\|Error\|out of memory" $R/logs/gpu0.log $R/logs/gpu1.log | cut -c1-300
