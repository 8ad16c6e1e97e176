#!/usr/bin/env bash
# Study: the LM head's GEMM in FP8 too (issue 51 item 4; benchmarks/studies/fp8_lm_head.md).
#   Question: does --fp8-lm-head (TE's Linear for the head, inside the FP8 autocast) make steps faster, and does the
#   20M-token loss stay inside the BF16 noise band (benchmarks/studies/loss_parity_20m.md) at two seeds?
#   Prediction (before the runs): llama-1b (32K vocabulary) +1-3% tokens/s over the BF16 head with the same full
#   logits, Llama-3.2-1B (128K) +5-10% (the head is ~13% of its BF16-head FP8 step); final validation loss within
#   the band (|gap to the BF16 mean| <= max(0.5%, the BF16 seed spread)) and within 1% of each seed's FP8 twin.
# Parts (one H200; a warm machine keeps .study/ between commands):
#   T  the GPU tests of the FP8 head (~1 min)
#   L1 / L2  llama-1b, 20M tokens of the Linux corpus, FP8 delayed with the FP8 head, seed 1234 / 4321 (~5 min each;
#        carry .corpus/linux-6.1.tokens.tar.xz)
#   H  Llama-3.2-1B plain FP8 command with --fp8-lm-head; HC the same without (--fused-loss off: the same full logits)
#   S  llama-1b plain FP8 command with --fp8-lm-head; SC the same without (--fused-loss off)
# Run on the device machine:  bash benchmarks/gpu.sh bash benchmarks/study_fp8_lm_head.sh T L1 H   (then T L2 HC S SC)
#   The checkout, the whole TE kit and the corpus are over the 64 MiB a device call carries: carry the kit's
#   install_te.sh, te_env.sh, payload/te_core_sm90.tar.xz, payload/wheels and the prebuilt
#   payload/transformer_engine_torch-*.whl (not torchao's wheel), and .corpus/linux-6.1.tokens.tar.xz.
# Results: $OUT/results.tar.gz (fp8-lm-head-h200/ for data/results/fp8-lm-head-h200/, loss-parity-20m/ for
#   data/results/loss-parity-20m/, the logs), packed after every part.
set -uo pipefail
OUT=${OUT:-/tmp/out}
RES=/tmp/res
MODELS=/tmp/family-models
mkdir -p $RES/fp8-lm-head-h200 $RES/loss-parity-20m $RES/logs
H=(python3 benchmarks/throughput.py --study fp8-lm-head-h200 --out $RES/fp8-lm-head-h200 --work /tmp/bench --timeout 240
   --steps 8 --warmup 3)
pack() { cp /tmp/bench/*.log $RES/logs/ 2>/dev/null; cp .study/loss-parity-20m/*.log $RES/logs/ 2>/dev/null
         tar -czf "$OUT/results.tar.gz" -C $RES . 2>/dev/null; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee $RES/gpu.txt
loss_run() {
  if [ ! -f .corpus/linux-6.1/manifest.json ]; then bash data/corpus/build_linux.sh --unpack .corpus > $RES/logs/corpus.txt 2>&1; fi
  python3 benchmarks/study_loss_parity.py --data .corpus/linux-6.1 --out .study/loss-parity-20m/results \
    --mirror $RES/loss-parity-20m --runs "$1" --budget-s 420 --min-left-s 0 2>&1 | tee -a $RES/logs/loss-runs.log | grep parity
}
folder() { [ -d $MODELS/llama-3.2-1b ] || python3 benchmarks/family_folders.py --out $MODELS llama-3.2-1b >> $RES/logs/folders.txt; }
for part in "$@"; do
  t0=$(date +%s)
  case $part in
  T) FP8LAB_GPU_RESULTS=$RES/gpu-results timeout 240 python3 -m pytest tests/gpu/test_fp8_lm_head_gpu.py -m gpu -q -rfEs \
       --tb=short -p no:cacheprovider > $RES/logs/gpu-tests.log 2>&1
     echo "pytest exit $?"; tail -3 $RES/logs/gpu-tests.log ;;
  L1) loss_run fp8-delayed-head ;;
  L2) loss_run fp8-delayed-head-s4321 ;;
  H) folder; "${H[@]}" --variants default-fp8-head --common-args '' --tag head --models $MODELS/llama-3.2-1b ;;
  HC) folder; "${H[@]}" --variants default-fp8 --common-args '--fused-loss off' --tag fused-off --models $MODELS/llama-3.2-1b ;;
  S) "${H[@]}" --variants default-fp8-head --common-args '' --tag head --models llama-1b ;;
  SC) "${H[@]}" --variants default-fp8 --common-args '--fused-loss off' --tag fused-off --models llama-1b ;;
  *) echo "part must be T, L1, L2, H, HC, S or SC" >&2 ;;
  esac
  echo "part $part: $(( $(date +%s) - t0 )) s"
  pack
done
