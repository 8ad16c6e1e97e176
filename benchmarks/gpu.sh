#!/usr/bin/env bash
# Set up a fresh H200 machine of the `device` tool once, then run one study or test command on it.
#
#   (device machine, repo root)  bash benchmarks/gpu.sh python3 benchmarks/throughput.py ...
#
# The call carries .gpu (the offline Transformer Engine kit, ../shared/te-h200, copied in) and .whl
# (wheels the image lacks: papermill/ipykernel for notebook runs). Installs TE 2.20.2 and torchao
# 0.18.0 into /tmp/site, puts this checkout on PYTHONPATH, and runs "$@" with unbuffered Python.
set -eo pipefail
cd "$(dirname "$0")/.."
bash .gpu/te-h200/install_te.sh /tmp/site >/dev/null
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/te-h200/payload/torchao/*.whl >/dev/null 2>&1 || true
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >/dev/null 2>&1
fi
source .gpu/te-h200/te_env.sh /tmp/site
export PYTHONPATH="$PWD:$PYTHONPATH" PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore::DeprecationWarning
"$@"
