#!/usr/bin/env bash
# Study: fine-tuning in FP8 on one GPU (fp8lab.data.sft, fp8lab.train.lora; benchmarks/studies/finetune.md).
#   Question: how much faster is FP8 than BF16 for instruction fine-tuning (full and LoRA), with the plain commands;
#   and does a real fine-tune in FP8 reach BF16's held-out answer loss (inside the BF16 seeds' band)?
# Parts (each packs its results as it goes):
#   S   SFT throughput, Llama-3.2-1B from its published config, BF16 and FP8: full, then LoRA rank 16 (~4 min)
#   P   the "user's pretrained model": llama-1b pretrained here on the Linux corpus (BF16, 4M tokens), saved with the
#       corpus's tokenizer (~1.5 min; carry .corpus/linux-6.1.tokens.tar.xz)
#   F   fine-tune that model on the shipped instruction set (data/sft/kjv-qa.jsonl: its own tokenizer, loss on the
#       answers only, 12 held-out examples), BF16 and FP8, seeds 1234 and 4321 (~2 min; needs P on this machine)
#   U   as F, FP8 without the calibration pass (--fp8-calibrate False: step 1 casts at scale 1.0, as before) (~1 min)
#   C   as F, FP8 with current scaling (--recipe current) (~1 min; needs P on this machine)
#   Q   as S for Qwen2.5-1.5B from its published config (~4 min)
#   L8  LoRA rank 16 on Llama-3.1-8B (all 32 layers) from its published config, BF16 and FP8 (~4 min)
#   LF  LoRA rank 16 on the fused blocks (--fuse True: fp8lab's adapters), Llama-3.2-1B, BF16 and FP8, beside peft's
#       on the unfused layers (--fuse False, as S runs it) in the same call (~4 min)
#   LF8 as LF for Llama-3.1-8B, the fused blocks only (~3 min)
#   LFQ as LF for Qwen2.5-1.5B, the fused blocks only (~2 min)
#   SS  as S, full SFT only (~2 min)
#   LF1 as LF, the fused blocks only (~1.5 min)
#   LA  the plain LoRA command (`--lora-rank 16`, `--fuse auto`: the fused blocks), Llama-3.2-1B and Llama-3.1-8B,
#       BF16 and FP8, after the GPU tests of LoRA and the fused conversion (~5 min; tag lora-v3: the adapters'
#       sum written into the GEMM's output; lora-v2 was before it, with the joined adapters, TE's SwiGLU kernels in
#       the split MLP and current scaling for sft; session 38's lora-auto before those; LA_MODELS picks the models)
#   FB  the loss study again, larger: after P, the instruction set prepared with the base's tokenizer and a quarter
#       held out (60 examples), then BF16, FP8 delayed (the default) and FP8 current over seeds 1234, 4321 and 2025,
#       into finetune-heldout-<gpu>/ (~6 min with P; needs P on this machine)
#   LP  where LoRA's step time goes (the trainer's --profile-steps: kernel time by category): Llama-3.2-1B at the
#       plain layout, full SFT and LoRA rank 16, BF16 and FP8, one profiled step each (~3 min)
#   CA  the plain full-SFT command once --recipe auto took current scaling for sft: Llama-3.2-1B, BF16 and FP8
#       (~1.5 min)
#   LC  as LA for Llama-3.1-8B at micro-batch 2, the layout before the memory estimate stopped counting LoRA's
#       bf16 inputs twice in BF16 (auto now takes 4) (~3 min)
#   LD  as LA with --recipe delayed (the frozen base's weight scales never change; full SFT's FP8 ran 5% faster
#       delayed than current in session 30): what the LoRA ratio would be if its loss check allowed delayed (~5 min)
#   LL  the loss check LD needs: after P, LoRA rank 16 on the pretrained base, the instruction set with a quarter held
#       out, BF16, FP8 delayed and FP8 current over seeds 1234, 4321 and 2025, into finetune-lora-heldout-<gpu>/
#       (~5 min; needs P on this machine)
#   LM  where the 8B LoRA's memory goes (benchmarks/lora_memory_probe.py): Llama-3.1-8B BF16, fused blocks at
#       micro-batch 1 and 2, peft's unfused at 2, two steps each (~2 min)
# Run on the device machine:
#   bash benchmarks/gpu.sh bash benchmarks/study_finetune.sh S
# Results: $OUT/results.tar.gz holds finetune-<gpu>/ (for data/results/) and the logs.
set -uo pipefail
OUT=${OUT:-/tmp/out}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -o -i -E "h100|h200" | tr 'H' 'h')
RES=/tmp/res-ft
STUDY=finetune-${GPU:-gpu}
rm -rf $RES /tmp/ft/bench  # a warm machine may keep an earlier call's results and logs: pack only this call's
mkdir -p $RES/$STUDY $RES/logs /tmp/ft
SFT=data/sft/kjv-qa.jsonl
H=(python3 benchmarks/throughput.py --out $RES/$STUDY --study $STUDY --work /tmp/ft/bench --timeout 400
   --variants default-bf16,default-fp8)
pack() { cp /tmp/ft/bench/*.log $RES/logs/ 2>/dev/null; tar -czf "$OUT/results.tar.gz" -C $RES . 2>/dev/null; }
# a BF16/FP8 pair of a published config on the shipped instruction set: MODEL STEPS TAG ARGS (2 warm-up steps)
pair() { "${H[@]}" --steps $2 --warmup 2 --data $SFT --common-args "$4" --tag $3 --models data/reference/configs/$1
         pack; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/gpu.txt
BASE=/tmp/ft/llama-1b-linux-4m
FT='--task sft --seq-len 1024 --micro-batch-size 4 --grad-accum 1 --lr 5e-5 --warmup-steps 3 --val-every 5'
FT="$FT --val-batches 4"
for part in "$@"; do
  t0=$(date +%s)
  case $part in
  SS) pair llama-3.2-1b 6 sft '--task sft' ;;
  LF1) pair llama-3.2-1b 6 lora-fuse-True '--task sft --lora-rank 16 --fuse True' ;;
  LA) timeout 240 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/gpu/test_lora_gpu.py tests/gpu/test_convert_gpu.py \
        > $RES/logs/la-tests.txt 2>&1; tail -1 $RES/logs/la-tests.txt; pack
      for m in ${LA_MODELS:-llama-3.2-1b llama-3.1-8b}; do pair $m 5 lora-v3 '--task sft --lora-rank 16'; done ;;
  LM) for run in True:1 True:2 False:2; do
        python3 benchmarks/lora_memory_probe.py --model data/reference/configs/llama-3.1-8b --data $SFT --task sft \
          --lora-rank 16 --fuse ${run%:*} --micro-batch-size ${run#*:} --grad-accum 1 --seq-len 2048 --steps 2 \
          --precision bf16 --val-every 0 --checkpoint-every -1 --progress off --plot False \
          --output-dir /tmp/ft/probe-$run > $RES/logs/probe-fuse-${run%:*}-mb${run#*:}.txt 2>&1
        grep -E "\[probe\]|layout|Error" $RES/logs/probe-fuse-${run%:*}-mb${run#*:}.txt; pack
      done ;;
  CA) pair llama-3.2-1b 6 sft-current '--task sft' ;;
  LD) for m in ${LA_MODELS:-llama-3.2-1b llama-3.1-8b}; do
        pair $m 5 lora-v3-delayed '--task sft --lora-rank 16 --recipe delayed'
      done ;;
  LL) HELD=/tmp/ft/kjv-qa-held25
      python3 -m fp8lab prepare-data --task sft --model $BASE --source $SFT --val-fraction 0.25 $HELD \
        > $RES/logs/prepare-held25.txt 2>&1; tail -1 $RES/logs/prepare-held25.txt
      LORA="${FT/--lr 5e-5/--lr 2e-4} --lora-rank 16"
      HL=("${H[@]}" --out $RES/finetune-lora-heldout-${GPU:-gpu} --study finetune-lora-heldout-${GPU:-gpu} --steps 15
          --warmup 3 --data $HELD --models $BASE)
      for seed in 1234 4321 2025; do
        "${HL[@]}" --seed $seed --tag lora-delayed-s$seed --common-args "$LORA --recipe delayed"; pack
        "${HL[@]}" --seed $seed --tag lora-current-s$seed --variants default-fp8 --common-args "$LORA --recipe current"
        pack
      done ;;
  LC) pair llama-3.1-8b 5 lora-v3-mb2 '--task sft --lora-rank 16 --micro-batch-size 2' ;;
  LP) for run in bf16:sft fp8:sft bf16:lora fp8:lora; do
        prec=${run%:*} kind=${run#*:}; lora=; [ $kind = lora ] && lora='--lora-rank 16'
        python3 -m fp8lab.train --model data/reference/configs/llama-3.2-1b --data $SFT --task sft $lora \
          --precision $prec --steps 5 --profile-steps 4 --output-dir /tmp/ft/prof-$run --progress off --plot False \
          --val-every 0 --checkpoint-every -1 --save-model False > $RES/logs/profile-$prec-$kind.txt 2>&1
        cp /tmp/ft/prof-$run/profile.json $RES/logs/profile-$prec-$kind.json 2>/dev/null
        grep -A12 "ms of cuda" $RES/logs/profile-$prec-$kind.txt | head -13; pack
      done ;;
  S)  pair llama-3.2-1b 6 sft '--task sft'; pair llama-3.2-1b 6 lora '--task sft --lora-rank 16 --fuse False' ;;
  P)  if [ ! -f .corpus/linux-6.1/manifest.json ]; then tar -xJf .corpus/linux-6.1.tokens.tar.xz -C .corpus; fi
      python3 -m fp8lab.train --model llama-1b --data .corpus/linux-6.1 --precision bf16 --tokens 4000000 \
        --seq-len 2048 --micro-batch-size 16 --grad-accum 1 --seed 1234 --output-dir /tmp/ft/base --progress off \
        --plot False --val-every 0 --checkpoint-every -1 > $RES/logs/pretrain.log 2>&1
      tail -3 $RES/logs/pretrain.log; cp /tmp/ft/base/summary.json $RES/logs/pretrain-summary.json 2>/dev/null
      rm -rf $BASE; mv /tmp/ft/base/model $BASE; pack ;;
  F)  for seed in 1234 4321; do
        "${H[@]}" --steps 15 --warmup 3 --seed $seed --data $SFT --tag ft-s$seed --models $BASE --common-args "$FT"
        pack
      done ;;
  U)  for seed in 1234 4321; do  # FP8 delayed as before the calibration pass: step 1 at TE's starting scales
        "${H[@]}" --variants default-fp8 --steps 15 --warmup 3 --seed $seed --data $SFT --tag ft-uncal-s$seed \
          --models $BASE --common-args "$FT --fp8-calibrate False"
        pack
      done ;;
  Q)  pair qwen2.5-1.5b 6 sft '--task sft'; pair qwen2.5-1.5b 6 lora '--task sft --lora-rank 16 --fuse False' ;;
  L8) pair llama-3.1-8b 5 lora '--task sft --lora-rank 16 --fuse False' ;;
  LF) for fuse in True False; do pair llama-3.2-1b 6 lora-fuse-$fuse "--task sft --lora-rank 16 --fuse $fuse"; done ;;
  LF8) pair llama-3.1-8b 5 lora-fuse-True '--task sft --lora-rank 16 --fuse True' ;;
  LFQ) pair qwen2.5-1.5b 6 lora-fuse-True '--task sft --lora-rank 16 --fuse True' ;;
  FB) HELD=/tmp/ft/kjv-qa-held25
      python3 -m fp8lab prepare-data --task sft --model $BASE --source $SFT --val-fraction 0.25 $HELD \
        > $RES/logs/prepare-held25.txt 2>&1; tail -1 $RES/logs/prepare-held25.txt
      HB=("${H[@]}" --out $RES/finetune-heldout-${GPU:-gpu} --study finetune-heldout-${GPU:-gpu} --steps 15 --warmup 3
          --data $HELD --models $BASE)
      for seed in 1234 4321 2025; do
        "${HB[@]}" --seed $seed --tag ft-s$seed --common-args "$FT"; pack
        "${HB[@]}" --seed $seed --tag ft-current-s$seed --variants default-fp8 --common-args "$FT --recipe current"; pack
      done ;;
  C)  for seed in 1234 4321; do  # FP8 with current scaling: no amax history to build up from a BF16 model
        "${H[@]}" --variants default-fp8 --steps 15 --warmup 3 --seed $seed --data $SFT --tag ft-current-s$seed \
          --models $BASE --common-args "$FT --recipe current"
        pack
      done ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "part $part: $(( $(date +%s) - t0 )) s" | tee -a $RES/logs/parts.txt
done
pack
