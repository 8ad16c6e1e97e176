#!/usr/bin/env bash
# The GPU branch of scripts/setup.sh, for real, on the H200 test machine (no network), in one command:
#  1. a clean copy of this checkout (tracked files only) in /tmp/fp8lab-clean;
#  2. `bash scripts/setup.sh` there, offline: FP8LAB_WHEELS=.whl (benchmarks/fetch_wheels.sh made it),
#     the TE kit .gpu/te-h200 (Transformer Engine 2.20.2 prebuilt for the image's torch 2.11.0+cu130),
#     the image's torch reused; base dependencies only (FP8LAB_EXTRAS=''; JupyterLab and the AWS SDK
#     are too large to carry);
#  3. the same command again (must only check what is there);
#  4. `fp8lab env` (must report Transformer Engine usable) and `fp8lab env --check`;
#  5. notebook 02 through `fp8lab notebooks run 02` on the kernel set-up registered (must run on the
#     GPU with backend 'te').
# Each step's seconds go to $OUT/steps.tsv, all output to $OUT/log.txt, a summary to $OUT/result.md.
#
#   on the CPU machine, once:  bash benchmarks/fetch_wheels.sh   (and the TE kit in .gpu/te-h200)
#   on the H200 (carry .gpu and .whl):  bash benchmarks/gpu_setup_check.sh
set -uo pipefail
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/gpu_setup_check}
CLEAN=${FP8LAB_CLEAN:-/tmp/fp8lab-clean}
mkdir -p "$OUT"
: >"$OUT/log.txt"
printf 'step\tseconds\texit\n' >"$OUT/steps.tsv"
FAILED=0
. "$SRC/benchmarks/steps.sh"

rm -rf "$CLEAN" && mkdir -p "$CLEAN"
# the files as they are (the device machine's copy of .git may not match its working tree), less what
# set-up and runs make and the carried kits
(cd "$SRC" && tar --exclude=./.git --exclude=./.venv --exclude=./outputs --exclude=./.gpu --exclude=./.whl \
  --exclude=./runs --exclude='*.egg-info' --exclude=__pycache__ -cf - .) | tar -xf - -C "$CLEAN"
export FP8LAB_WHEELS="$SRC/.whl" FP8LAB_TE_KIT="$SRC/.gpu/te-h200" FP8LAB_EXTRAS="" PYTHON=python3
step setup bash scripts/setup.sh
step setup_again bash scripts/setup.sh
# after set-up, every step as a user's shell has it: the venv's activate (it puts torch's cuDNN first)
in_venv() { bash -c '. .venv/bin/activate && "$@"' in_venv "$@"; }
step env in_venv fp8lab env
step env_check in_venv fp8lab env --check
step env_json in_venv sh -c 'fp8lab env --json > "$0/env.json"' "$OUT"
step te_usable .venv/bin/python -c "import json, sys; d = json.load(open(sys.argv[1])); \
print('te:', d['backends']['te'], '| auto:', d['auto_backend']); sys.exit(d['backends']['te'] is not None or d['auto_backend'] != 'te')" "$OUT/env.json"
step notebook_02 in_venv fp8lab notebooks run 02 -o "$OUT/nb"
step notebook_02_on_gpu .venv/bin/python -c "import sys; from fp8lab.notebooks import read_glued; \
g = read_glued(sys.argv[1]); print({k: g[k] for k in ('backend', 'model', 'fp8_on_logits_rel_diff', 'timings')}); \
sys.exit(g['backend'] != 'te')" "$OUT/nb/02_convert_to_te.ipynb"
[ -f "$OUT/nb/02_convert_to_te/fp8_error_per_layer.png" ] && mv "$OUT/nb/02_convert_to_te/fp8_error_per_layer.png" "$OUT/"
[ -f "$OUT/nb/02_convert_to_te.ipynb" ] && mv "$OUT/nb/02_convert_to_te.ipynb" "$OUT/"
rm -rf "$OUT/nb"
{
  echo "# scripts/setup.sh, GPU branch, offline on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  echo
  echo "command: \`bash benchmarks/gpu_setup_check.sh\` (carry .gpu .whl), $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "checkout: ${FP8LAB_COMMIT:-$(git -C "$SRC" rev-parse --short HEAD 2>/dev/null || echo unknown)} ; python3 $(python3 --version 2>&1 | cut -d" " -f2)"
  echo "versions in the venv: $("$CLEAN/.venv/bin/python" -c 'import importlib.metadata as m; print(", ".join(f"{p} {m.version(p)}" for p in ("torch", "transformer_engine", "torchao", "transformers", "papermill")))' 2>&1)"
  echo
  steps_table
  echo
  echo "result: $([ "$FAILED" = 0 ] && echo 'all steps passed' || echo 'FAILED (see log.txt)')"
} >"$OUT/result.md"
cat "$OUT/result.md"
exit "$FAILED"
