#!/usr/bin/env bash
# Study: the LM head's three GEMMs in FP8 inside the fused loss's chunks (fp8lab.train.fp8_head; `--fp8-lm-head auto`
# runs it once this study's check passes), on P5's GPU (one H100 80 GB; benchmarks/studies/fp8_lm_head.md).
#   Question: with the head's GEMMs in FP8 (E4M3 forward, E5M2 gradient, a power-of-two scale per tensor), how much
#   faster is the plain FP8 command than the same with the head in BF16 (the former default), what FP8/BF16 ratio do
#   the plain commands reach, and is the loss inside the BF16-head runs' seed band (llama-1b, Linux corpus, 5M tokens)?
#   Prediction (written before the runs): FP8 with the head in FP8 over FP8 with it in BF16: llama-1b (32K vocabulary)
#   +1-3%, Llama-3.2-1B (128K) +6-10%, Qwen2.5-1.5B (152K) +4-8%; FP8/BF16: 1.32x, 1.36x, 1.32x; loss inside the band.
# Parts (each packs its results as it goes):
#   T  the GPU tests of the FP8 head (~1 min)
#   S  Llama-3.2-1B, llama-1b and Qwen2.5-1.5B (published configs, random weights): plain BF16, plain FP8 with
#      --fp8-lm-head True, and plain FP8 with --fp8-lm-head False, one after another (~6 min)
#   S1 Llama-3.2-1B alone, as in S (~2 min)
#   S2 Llama-3.2-1B and Qwen2.5-1.5B (the 128K-152K vocabularies), as in S (~4 min)
#   L  the loss runs: FP8 delayed with the head in FP8 and in BF16, seeds 1234 and 4321, 5M tokens (~6 min;
#      carry .corpus/linux-6.1.tokens.tar.xz)
#   LB as L, the BF16-head run of seed 4321 alone (~1.5 min; the rest of L is in data/results/fp8-head-chunks-h100:
#      run it in a checkout that has those records, and the loss check reads all four)
#   C  the check on the device, after L or LB: loss.json and check.json from the committed records plus this call's
#      (TESTS_LOG: part T's log, default this call's), then fp8lab/plan/evidence.json re-rendered so part A's plain
#      commands read the verdict here as they would after `fp8lab report --docs` (~10 s)
#   A  the plain commands after C: Llama-3.2-1B, Qwen2.5-1.5B and llama-1b, BF16 and FP8 with nothing set, so
#      --fp8-lm-head auto decides (run ids end in -<gpu>-auto; ~5 min)
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_fp8_head_chunks.sh T S
# Results: $OUT/results.tar.gz holds fp8-head-chunks-h100/ (or -h200/, by the GPU; for data/results/) and the logs.
# Then, here: python benchmarks/fp8_head_check.py data/results/fp8-head-chunks-h100 --tests-log <logs>/tests.txt writes
# check.json, and `fp8lab report --docs` puts its verdict in fp8lab/plan/evidence.json (what --fp8-lm-head auto reads).
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/res
MODELS=/tmp/family-models
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$GPU" in *H200*) G=h200 ;; *) G=h100 ;; esac  # the results' folder says which GPU ran them
DIR=fp8-head-chunks-$G${TAG:+-$TAG}  # TAG (optional): a later version of the head, in a folder and run ids of its own
G=$G${TAG:+-$TAG}
mkdir -p $RES/$DIR $RES/logs
H=(python3 benchmarks/throughput.py --out $RES/$DIR --study $DIR --work /tmp/bench --timeout 300 --steps 8 --warmup 3
   --variants default-bf16,default-fp8-fp8head,default-fp8-bf16head --common-args '' --tag $G)
pack() { cp /tmp/bench/*.log .study/$DIR/*.log $RES/logs/ 2>/dev/null; tar -czf "$OUT/results.tar.gz" -C $RES . 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/gpu.txt
for part in "$@"; do
  t0=$(date +%s)
  case $part in
  T)  FP8LAB_GPU_RESULTS=$RES/gpu-results timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu \
        tests/gpu/test_fp8_head_chunks_gpu.py tests/gpu/test_fp8_lm_head_gpu.py \
        > $RES/logs/tests.txt 2>&1; grep -E "^(FAILED|ERROR)|passed|failed" $RES/logs/tests.txt; pack ;;
  S)  python3 benchmarks/family_folders.py --out $MODELS llama-3.2-1b qwen2.5-1.5b >> $RES/logs/folders.txt 2>&1
      for m in $MODELS/llama-3.2-1b llama-1b $MODELS/qwen2.5-1.5b; do "${H[@]}" --models $m; pack; done ;;
  S1) python3 benchmarks/family_folders.py --out $MODELS llama-3.2-1b >> $RES/logs/folders.txt 2>&1
      "${H[@]}" --models $MODELS/llama-3.2-1b; pack ;;
  S2) python3 benchmarks/family_folders.py --out $MODELS llama-3.2-1b qwen2.5-1.5b >> $RES/logs/folders.txt 2>&1
      for m in $MODELS/llama-3.2-1b $MODELS/qwen2.5-1.5b; do "${H[@]}" --models $m; pack; done ;;
  L|LB)
      if [ ! -f .corpus/linux-6.1/manifest.json ]; then tar -xJf .corpus/linux-6.1.tokens.tar.xz -C .corpus; fi
      RUNS=headchunks-s1234,headbf16-s1234,headchunks-s4321,headbf16-s4321
      if [ $part = LB ]; then RUNS=headbf16-s4321; cp data/results/$DIR/llama-1b-te-*-5m-*.jsonl $RES/$DIR/; fi
      python3 benchmarks/study_loss_parity.py --data .corpus/linux-6.1 --out $RES/$DIR --work .study/$DIR --study $DIR \
        --tag-prefix 5m --tokens 5000000 --common-args '--seq-len 2048 --micro-batch-size 16 --grad-accum 1 --fp8-stats-every 0' \
        --gpus 1 --budget-s 500 --min-left-s 90 --runs $RUNS >> $RES/logs/loss.log 2>&1 &
      job=$!; while kill -0 $job 2>/dev/null; do sleep 20; pack; done; wait $job  # packed as runs finish: a cut-off
      tail -5 $RES/logs/loss.log                                                 # call still returns them
      python3 benchmarks/memory_modes_loss.py $RES/$DIR te-fp8-delayed-head bf16 > $RES/logs/loss-check.txt 2>&1; pack ;;
  C)  cp $RES/$DIR/llama-1b-te-*-5m-*.jsonl data/results/$DIR/ 2>/dev/null
      python3 benchmarks/memory_modes_loss.py data/results/$DIR te-fp8-delayed-head bf16 > $RES/logs/loss-check.txt 2>&1
      python3 benchmarks/fp8_head_check.py data/results/$DIR --tests-log "${TESTS_LOG:-$RES/logs/tests.txt}" \
        > $RES/logs/check.txt 2>&1; cat $RES/logs/check.txt
      cp data/results/$DIR/loss.json data/results/$DIR/check.json $RES/$DIR/ 2>/dev/null
      python3 -c "from fp8lab.plan import evidence; print(evidence.render('data/results'), end='')" > /tmp/evidence.json \
        && cp /tmp/evidence.json fp8lab/plan/evidence.json && cp /tmp/evidence.json $RES/logs/evidence.json; pack ;;
  A)  python3 benchmarks/family_folders.py --out $MODELS llama-3.2-1b qwen2.5-1.5b >> $RES/logs/folders.txt 2>&1
      for m in $MODELS/llama-3.2-1b $MODELS/qwen2.5-1.5b llama-1b; do
        "${H[@]}" --variants default-bf16,default-fp8 --tag $G-auto --models $m; pack; done ;;
  *) echo "unknown part $part"; exit 2 ;;
  esac
  echo "part $part: $(( $(date +%s) - t0 )) s" | tee -a $RES/logs/parts.txt
done
pack
