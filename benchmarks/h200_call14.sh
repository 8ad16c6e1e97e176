#!/usr/bin/env bash
# H200 call 14 (session 3), two GPUs: where the two-GPU FSDP2 step loses time against one GPU.
# torchrun + FSDP2, llama-1b, bf16 parameters, micro-batch 8 x 4, TE BF16 and FP8 delayed, as in
# call 11, with the last step profiled on rank 0 (kernel time by category incl. NCCL, GPU busy).
set -u
R=/tmp/res; mkdir -p $R/throughput-h200
python3 -c "from fp8lab.data import prepare_data; prepare_data(None, '/tmp/data-32k', None, vocab_size=32000)" >/dev/null
timeout 170 python3 benchmarks/throughput.py --data /tmp/data-32k --out $R/throughput-h200 --work /tmp/w2 \
  --models llama-1b --tag ga4-prof --nproc 2 --parallel fsdp --variants te-bf16-p16,te-fp8-delayed-p16 --steps 13 --warmup 4 \
  --common-args "--seq-len 2048 --micro-batch-size 8 --grad-accum 4 --profile-steps 13" --timeout 80 2>&1 | grep "^\[bench\]"
grep -h -A12 "fp8lab: profile" /tmp/w2/*.log | grep -v "fp8lab-metrics"
