#!/usr/bin/env bash
# Create .venv and install fp8lab with everything the notebooks and tests need.
# Idempotent: a second run only checks what is installed. On a machine without an NVIDIA
# GPU it installs the CPU build of torch first (never a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${FP8LAB_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PY --version)"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# pip's notes about this machine's local package mirrors are noise; errors still show (and the
# import check below fails the set-up if anything is missing)
quiet() { grep -v "^WARNING: Location" || true; }
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] NVIDIA GPU found: installing torch from PyPI (CUDA build)"
    "${PIP[@]}" install "${FP8LAB_TORCH_SPEC:-torch}" 2>&1 | quiet
  else
    echo "[setup] no GPU: installing the CPU build of torch (${FP8LAB_TORCH_SPEC:-torch==2.13.0})"
    "${PIP[@]}" install "${FP8LAB_TORCH_SPEC:-torch==2.13.0}" 2>&1 | quiet
  fi
  # never let the requirements below pull a multi-GB CUDA torch because this step failed
  "$VENV/bin/python" -c "import torch" || { echo "[setup] torch did not install" >&2; exit 1; }
fi
echo "[setup] installing fp8lab and its requirements"
"${PIP[@]}" install -r requirements.txt -e ".[dev,aws,notebooks]" 2>&1 | quiet
"$VENV/bin/python" -c "import fp8lab, torch, transformers, papermill" \
  || { echo "[setup] install failed: fp8lab or a dependency does not import" >&2; exit 1; }
# The notebooks run on a kernel named python3 that must be this venv's interpreter.
"$VENV/bin/python" -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (fp8lab)" >/dev/null
echo "[setup] ready: $("$VENV/bin/python" -c 'import torch, fp8lab; print("fp8lab", fp8lab.__version__, "torch", torch.__version__)')"
