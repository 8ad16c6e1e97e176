#!/usr/bin/env bash
# Study: loss you can trust, one epoch of real data (issue 31; benchmarks/studies/loss_parity_20m.md).
#   llama-1b, 20M+ unique training tokens of the Linux 6.1 corpus (data/corpus/build_linux.sh), one epoch:
#   BF16 seed 1234, BF16 seed 4321 (the noise band), FP8 delayed and FP8 current scaling (seed 1234: the same
#   init and data order as the first BF16 run); validation loss every 25 steps on the held-out 5% of documents.
#   Layout fixed (2048 x 16 x accumulation 1 = 32,768 tokens a step, 611 steps = 20.0M tokens), lr 3e-4,
#   30 warm-up steps, bf16 parameters with fp32 master weights (the GPU default).
# Expected GPU time (data/results/loss-1b, data/results/defaults-plan-h200: ~67-77k tok/s BF16, ~85-102k FP8):
#   a BF16 run ~4.5-5 min, an FP8 run ~3.5-4 min, plus ~1 min each to start, validate and checkpoint.
#   On nvidia-h200-x2 (two runs at once): command 1 = both BF16 runs (~6-7 min), command 2 = both FP8 runs
#   (~5-6 min). On one H200: three or four commands (~20-22 min in all).
# Resumable: each command trains for at most --budget-s (default 450 s), then SIGTERMs the runs still going (they
#   checkpoint) and exits 3; the same command again, on the same warm machine, resumes them. Exit 0: all done.
# Run on the device machine (carry .corpus/linux-6.1.tokens.tar.xz, 9.9 MiB; or the text .corpus/linux-6.1.jsonl.xz,
#   10.0 MiB, tokenized there in ~1 min):
#   bash benchmarks/gpu.sh bash benchmarks/study_loss_parity.sh
# Results: $OUT/loss-parity-20m/*.jsonl (for data/results/loss-parity-20m/; FP8 health records inside: the runs this
#   command finished), parity.json; $OUT/loss-parity-20m-all.tar.gz: all results so far and the runs' logs. A machine
#   that went cold starts the study afresh.
# Options after the script name go to benchmarks/study_loss_parity.py (e.g. --runs fp8-delayed --gpus 1).
# DATA=<prepared folder> skips the corpus build (the CPU test passes a tiny one).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
PY=${PYTHON:-python3}
DATA=${DATA:-.corpus/linux-6.1}
if [ ! -f "$DATA/manifest.json" ]; then  # the carried tokens (unpacked), else the carried text (tokenized here)
  if [ -f .corpus/linux-6.1.tokens.tar.xz ]; then mode=--unpack
  elif [ -f .corpus/linux-6.1.jsonl.xz ]; then mode=--tokens-only
  else echo "no $DATA, no .corpus/linux-6.1.tokens.tar.xz or .jsonl.xz: carry one (data/README.md)" >&2; exit 2; fi
  t0=$(date +%s)
  PYTHON=$PY bash data/corpus/build_linux.sh $mode .corpus | tee "$OUT/corpus-build.txt"
  echo "corpus tokenized in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/corpus-build.txt"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
set +e
# results and run folders stay in .study/ (ignored by git, kept on a warm machine between commands); each command
# copies what exists so far to $OUT (a fresh folder per command)
RES=${RESULTS:-.study/loss-parity-20m/results}
"$PY" benchmarks/study_loss_parity.py --data "$DATA" --out "$RES" --mirror "$OUT/loss-parity-20m" "$@"
rc=$?
# $OUT/loss-parity-20m/: the result files of the runs this command finished (--mirror, as each finished) and
# parity.json; every result so far and the runs' logs in one archive beside it (the device tool returns at most 8
# files: session 14 lost a result file to that when every file was copied loose)
mkdir -p "$OUT/loss-parity-20m"
cp "$RES/parity.json" "$OUT/loss-parity-20m/" 2>/dev/null
S=$(mktemp -d); cp "$RES"/* "$S/" 2>/dev/null; cp .study/loss-parity-20m/*.log "$S/" 2>/dev/null
tar -czf "$OUT/loss-parity-20m-all.tar.gz" -C "$S" . && rm -rf "$S"
exit $rc
