#!/usr/bin/env bash
# The GPU test suite on the H200 (after benchmarks/gpu.sh set the machine up): every test marked gpu,
# then notebooks 02 and 05 executed on the GPU and scanned for warnings and stderr.
#   (device machine)  bash benchmarks/gpu.sh bash benchmarks/h200_gpu_tests.sh [PYTEST ARGS]
# Writes $OUT/gpu-tests.log, $OUT/gpu-results/*.jsonl (figures the tests record) and
# $OUT/notebooks.json (what the executed notebooks show). Set NOTEBOOKS=0 to skip the notebooks, TESTS (see below), TEST_TIMEOUT
# (seconds, default 420) to bound pytest itself (an outer timeout would leave pytest running on the GPU).
set -uo pipefail
OUT=${OUT:-/tmp/out}
export FP8LAB_GPU_RESULTS=$OUT/gpu-results
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, transformer_engine as te; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__, 'te', te.__version__)" | tee -a "$OUT/gpu.txt"
# TESTS: the paths pytest collects (default: all of tests/; a test file there collects only its imports, so a run
# that carries only some wheels, e.g. without nbformat, can still test one file)
timeout ${TEST_TIMEOUT:-420} python3 -m pytest ${TESTS:-tests} -m gpu -q -rfEs --tb=short -p no:cacheprovider "$@" > "$OUT/gpu-tests.log" 2>&1
echo "pytest exit $?"
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed" "$OUT/gpu-tests.log"
if [ "${NOTEBOOKS:-1}" != 0 ]; then
  python3 -m ipykernel install --user --name python3 >/dev/null 2>&1
  nb=/tmp/nb
  timeout 240 python3 -m fp8lab notebooks run 02 -o $nb/default > "$OUT/notebooks.log" 2>&1
  timeout 240 python3 -m fp8lab notebooks run 02 -o $nb/7b -p size 7b -p num_layers 2 -p seq_len 512 >> "$OUT/notebooks.log" 2>&1
  timeout 240 python3 -m fp8lab notebooks run 05 -o $nb/default >> "$OUT/notebooks.log" 2>&1
  tail -5 "$OUT/notebooks.log"
  python3 benchmarks/notebook_outputs.py "$OUT/notebooks.json" $(find $nb -name "0*.ipynb" | sort)
fi
